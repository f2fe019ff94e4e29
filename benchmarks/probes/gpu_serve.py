"""`kiln serve` on one GPU against the same engines in-process (issue 24's "done when"): ResNet-50 and BERT-base
(seq 128) fp16 with dynamic batching, MiniLM with dynamic batch and sequence merged by the padding config.

    python -m benchmarks.probes.gpu_serve --out DIR [--budget-seconds 480] [--clients 8] [--duration 10]
    python -m benchmarks.probes.gpu_serve --smoke --device cpu --out /tmp/serve-smoke   # tiny models, ~1 minute

Steps (each part guarded: a failure is recorded with its error and the rest still run; parts past --budget-seconds
are skipped and say so):

1. export (cached in --cache) and build fp16 engines with kiln.build into a temporary repository MODEL/1/model.plan +
   config.toml: resnet50 (batch 1..64), bert (batch 1..64, seq 128), minilm (batch 1..64, seq 8..256, served with
   [dynamic_batching.padding] on axis 1); every model max_batch_size 64, preferred [64, 32, 16], --queue-delay-us,
   --instances. The same plans are served again as resnet50_nodelay and bert_nodelay (no queue delay, one instance:
   for concurrency 1) and bert_bounded (max_queue_size --overload-queue: for the overload run).
2. offline, the same engine in-process: batch 64 device-resident (CUDA events, items/s); batch 1 median ms with host
   numpy in → numpy out (as the server does) and device-resident.
3. `python -m kiln serve REPO --device cuda` as a subprocess, then over gRPC (tritonclient): concurrency 1 (median,
   p99, against the _nodelay copy and against the model as configured; server adds = the _nodelay p50 - engine host
   p50; server-side means per request from the statistics read before and after: success, queue, compute_input /
   infer / output, and outside the server = client p50 / mean - success); concurrency --concurrency with batch-1
   requests from --clients processes each running kiln.cli.loadgen.run_load (infer/s summed, per-process p50
   averaged by request count, p99 the worst process's; errors; ratio to offline items/s; mean executed batch from the
   server's statistics); bert at 2x that concurrency against bert_bounded (requests answered to clients vs requests
   the server counted).
4. minilm: batch-1 requests of random length in 8..256 at --minilm-concurrency; a burst of 16 concurrent requests
   compared with the engine run alone on each (max abs diff); mean executed batch.
5. memory: --memory-requests minilm seq-16 requests at --concurrency (capped to what the measured rate finishes in
   --memory-seconds); the server's RSS and GPU memory (nvidia-smi) at start, after warm-up, every 10% and at the end.

Writes DIR/gpu-serve-<device>-<date>.json (after every part) and .md, and prints the markdown at the end.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import re
import resource
import shutil
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MAX_BATCH = 64
PREFERRED = [64, 32, 16]
VOCAB_IDS = 1000  # token ids sent to the server: below every model's vocabulary

def _outputs_arg(text: str) -> dict[str, list[str]]:
    """`bert=pooler_output,resnet50=logits` → {"bert": ["pooler_output"], ...} (`+` joins several outputs)."""
    out = {}
    for item in filter(None, text.split(",")):
        model, _, names = item.partition("=")
        if not names:
            raise argparse.ArgumentTypeError(f"{item!r} is not model=output")
        out[model] = names.split("+")
    return out


# ------------------------------------------------------------------ client processes (light imports only: spawned)


def _client_main(index: int, jobs, results) -> None:
    """A client process: run each job from `jobs` (None ends it) and put its result (or error) on `results`."""
    while True:
        job = jobs.get()
        if job is None:
            return
        try:
            delay = job["start_at"] - time.time()
            if delay > 0:
                time.sleep(delay)
            out = _varlen_load(job) if job["kind"] == "varlen" else _fixed_load(job)
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which records it
            out = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-1500:]}
        out["worker"] = index
        results.put(out)


def _fixed_load(job: dict) -> dict:
    from kiln.cli.loadgen import run_load

    r = run_load(job["url"], job["model"], job["feeds"], protocol=job.get("protocol", "grpc"),
                 concurrency=job["concurrency"],
                 requests=job.get("requests"), duration_s=job.get("duration"), timeout_s=job.get("timeout", 60.0),
                 shared_memory=job.get("shared_memory", "none"), outputs=job.get("outputs"))
    r.pop("shapes", None)
    return r


def _varlen_load(job: dict) -> dict:
    """Batch-1 token requests of random length in [lo, hi] from `concurrency` threads for `duration` seconds."""
    import tritonclient.grpc as gc

    lo, hi, names = job["lo"], job["hi"], job["names"]
    lock = threading.Lock()
    lat: list[float] = []
    errors: dict[str, int] = {}
    counts = {"sent": 0}
    deadline = time.perf_counter() + job["duration"]

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        client = gc.InferenceServerClient(job["url"])
        try:
            while time.perf_counter() < deadline:
                ins = _token_inputs(gc, names, rng, int(rng.integers(lo, hi + 1)))
                with lock:
                    counts["sent"] += 1
                t0 = time.perf_counter()
                try:
                    client.infer(job["model"], ins, client_timeout=60.0)
                except Exception as e:  # noqa: BLE001 - counted by type
                    with lock:
                        errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                else:
                    with lock:
                        lat.append((time.perf_counter() - t0) * 1e3)
        finally:
            client.close()

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(job["seed"] * 1000 + i,), daemon=True)
               for i in range(job["concurrency"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = sum(errors.values())
    return {"sent": counts["sent"], "requests": len(lat) + failed, "succeeded": len(lat), "failed": failed,
            "errors": errors, "duration_s": time.perf_counter() - start, "latencies_ms": lat}


def _token_inputs(gc, names: list[str], rng, length: int, ids: np.ndarray | None = None) -> list:
    ids = rng.integers(1, VOCAB_IDS, (1, length), dtype=np.int64) if ids is None else ids
    values = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    out = []
    for n in names:
        inp = gc.InferInput(n, list(values[n].shape), "INT64")
        inp.set_data_from_numpy(values[n])
        out.append(inp)
    return out


class Clients:
    """K spawned client processes, each with its own job queue, started once and reused by every load run."""

    def __init__(self, k: int):
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.jobs = [ctx.Queue() for _ in range(k)]
        self.procs = [ctx.Process(target=_client_main, args=(i, q, self.results), daemon=True)
                      for i, q in enumerate(self.jobs)]
        for p in self.procs:
            p.start()

    def run(self, jobs: list[dict], timeout_s: float) -> list[dict]:
        """Each job on its own process, all starting together; their results (worker order)."""
        if len(jobs) > len(self.jobs):
            raise ValueError(f"{len(jobs)} jobs for {len(self.jobs)} client processes")
        start_at = time.time() + 0.2
        for q, job in zip(self.jobs, jobs):
            q.put({**job, "start_at": start_at})
        out, deadline = [], time.perf_counter() + timeout_s
        while len(out) < len(jobs):
            try:
                out.append(self.results.get(timeout=1.0))
            except queue.Empty:
                dead = [i for i, p in enumerate(self.procs[:len(jobs)]) if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"client processes {dead} died (exit codes "
                                       f"{[self.procs[i].exitcode for i in dead]})") from None
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"client processes did not answer in {timeout_s:.0f} s") from None
        return sorted(out, key=lambda r: r["worker"])

    def close(self) -> None:
        for q in self.jobs:
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)


def split(total: int, k: int) -> list[int]:
    """`total` spread over at most `k` parts, none empty."""
    k = max(1, min(k, total))
    return [total // k + (1 if i < total % k else 0) for i in range(k)]


def combine(parts: list[dict]) -> dict:
    """The load runs of several processes as one: summed counts, infer/s over the longest process's window."""
    errs = [p for p in parts if "error" in p and "succeeded" not in p]
    if errs:
        raise RuntimeError(f"client process failed: {errs[0]['error']}\n{errs[0].get('traceback', '')}")
    ok = sum(p["succeeded"] for p in parts)
    window = max(p["duration_s"] for p in parts)
    errors: dict[str, int] = {}
    for p in parts:
        for k, v in p["errors"].items():
            errors[k] = errors.get(k, 0) + v
    out = {"processes": len(parts), "requests": sum(p["requests"] for p in parts), "succeeded": ok,
           "failed": sum(p["failed"] for p in parts), "errors": errors, "duration_s": window,
           "infer_per_s": ok / window if window > 0 else 0.0}
    if all("latencies_ms" in p for p in parts):
        ms = np.concatenate([np.asarray(p["latencies_ms"], float) for p in parts])
        out["sent"] = sum(p["sent"] for p in parts)
        out |= {"p50_ms": _pct(ms, 50), "p99_ms": _pct(ms, 99), "latency": "exact over all processes"}
    else:
        p50 = [(p["latency_ms"]["p50"], p["succeeded"]) for p in parts if p["latency_ms"]["p50"] is not None]
        p99 = [p["latency_ms"]["p99"] for p in parts if p["latency_ms"]["p99"] is not None]
        out |= {"p50_ms": sum(v * n for v, n in p50) / max(1, sum(n for _, n in p50)) if p50 else None,
                "p99_ms": max(p99) if p99 else None,
                "latency": "p50: per-process p50s averaged by request count; p99: the worst process's p99",
                "per_process_p50_ms": [p["latency_ms"]["p50"] for p in parts]}
        examples = {}
        for p in parts:
            examples |= p.get("error_examples", {})
        if examples:
            out["error_examples"] = examples
    return out


def _pct(ms: np.ndarray, q: float) -> float | None:
    return float(np.percentile(ms, q)) if ms.size else None


# ------------------------------------------------------------------ the server


class Server:
    """`python -m kiln serve` as a subprocess, its stderr in a log file."""

    def __init__(self, repo: Path, args, log: Path):
        self.log = log
        command = [*shlex.split(args.server_prefix), sys.executable, "-m", "kiln", "serve", str(repo),
                   "--grpc-port", str(args.grpc_port),
                   "--http-port", str(args.http_port), "--metrics-port", "-1", "--device", args.device,
                   *(["--shared-memory"] if args.shared_memory else []), "--workers", str(args.workers),
                   *shlex.split(args.server_args)]
        self.workers = args.workers
        self.command = " ".join(command)
        self.prefixed = bool(args.server_prefix)
        with open(log, "w") as err:
            self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.url = ""
        self.http_url = ""

    def wait_ready(self, models: list[str], timeout_s: float) -> float:
        """Seconds until every model is ready over gRPC; RuntimeError (with the log's tail) otherwise."""
        import tritonclient.grpc as gc

        start = time.perf_counter()
        deadline = start + timeout_s
        while not self.url or self.log.read_text(errors="replace").count("gRPC on ") < self.workers:
            if self.proc.poll() is not None or time.perf_counter() > deadline:
                raise RuntimeError(f"server did not start (exit {self.proc.poll()}):\n{self.tail()}")
            for line in self.log.read_text(errors="replace").splitlines():
                if "gRPC off" in line:
                    raise RuntimeError(f"the server has no gRPC (pip install grpcio tritonclient[grpc]):\n{line}")
                if "gRPC on " in line:
                    self.url = line.split("gRPC on ")[1].strip()
                if "HTTP on http://" in line:
                    self.http_url = line.split("HTTP on http://")[1].strip()
            time.sleep(0.2)
        client = gc.InferenceServerClient(self.url)
        try:
            while True:
                try:
                    if client.is_server_ready() and all(client.is_model_ready(m) for m in models):
                        return time.perf_counter() - start
                except Exception:  # noqa: BLE001 - not up yet
                    pass
                if self.proc.poll() is not None or time.perf_counter() > deadline:
                    raise RuntimeError(f"server or models {models} not ready in {timeout_s:.0f} s "
                                       f"(exit {self.proc.poll()}):\n{self.tail()}")
                time.sleep(0.2)
        finally:
            client.close()

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            targets = [self.proc]
            if self.prefixed:  # stop the server under the wrapper (a profiler writes its output when it exits)
                kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
                pids = [int(p) for p in kids.read_text().split()] if kids.exists() else []
                for pid in pids:
                    os.kill(pid, signal.SIGTERM)
                targets = [] if pids else targets
            for t in targets:
                t.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def rss_mb(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss / 2**20
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 - process gone
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def gpu_mb(pid: int) -> float | str | None:
    """The process's GPU memory by nvidia-smi (MiB); None without nvidia-smi, a note if the pid is not listed."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi failed: {e}"
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if "," in line]
    for row in rows:
        if row[0] == str(pid):
            try:
                return float(row[1])
            except ValueError:
                return row[1]
    return f"pid not listed; nvidia-smi saw {rows}"


def _model_stats(url: str, model: str) -> list[dict]:
    """The server's statistics JSON entries of `model` (one per loaded version)."""
    import tritonclient.grpc as gc

    client = gc.InferenceServerClient(url)
    try:
        return client.get_inference_statistics(model_name=model, as_json=True).get("model_stats", [])
    finally:
        client.close()


def statistics(url: str, model: str) -> dict:
    """The model's counters summed over its versions: inference/execution counts, requests answered."""
    out = {"inference_count": 0, "execution_count": 0, "success": 0, "fail": 0}
    for m in _model_stats(url, model):
        out["inference_count"] += int(m.get("inference_count", 0) or 0)
        out["execution_count"] += int(m.get("execution_count", 0) or 0)
        for k in ("success", "fail"):
            out[k] += int(m.get("inference_stats", {}).get(k, {}).get("count", 0) or 0)
    return out


STAGES = ("success", "queue", "compute_input", "compute_infer", "compute_output")


def stage_totals(url: str, model: str) -> dict:
    """The model's Triton statistics stages summed over its versions: stage → [count, ns]."""
    out = {k: [0, 0] for k in STAGES}
    for m in _model_stats(url, model):
        for k in STAGES:
            d = m.get("inference_stats", {}).get(k, {})
            out[k][0] += int(d.get("count", 0) or 0)
            out[k][1] += int(d.get("ns", 0) or 0)
    return out


def stage_means(before: dict, after: dict) -> dict:
    """Server-side ms per request of each stage between two `stage_totals`, and `other` (success less the stages:
    the hand-offs to and from the engine's worker thread and the event loop)."""
    out = {}
    for k in STAGES:
        n, ns = after[k][0] - before[k][0], after[k][1] - before[k][1]
        out[f"{k}_ms"] = ns / n / 1e6 if n else None
    out["requests"] = after["success"][0] - before["success"][0]
    parts = [out[f"{k}_ms"] for k in STAGES[1:]]
    out["other_ms"] = out["success_ms"] - sum(parts) if None not in parts and out["success_ms"] is not None else None
    return out


LAG = re.compile(r'kiln_event_loop_lag_seconds_(count|sum|bucket)\{(?:le="([^"]+)",)?process="([^"]+)"\} (\S+)')


FRONT = re.compile(r'kiln_frontend_(request|link)_seconds_(count|sum)\{model="([^"]+)"\} (\S+)')


def metrics_text(http_url: str) -> str:
    """The server's /metrics exposition ('' without an HTTP port or when it does not answer)."""
    import urllib.request

    if not http_url:
        return ""
    try:
        with urllib.request.urlopen(f"http://{http_url.removeprefix('http://')}/metrics", timeout=5) as r:
            return r.read().decode()
    except OSError:
        return ""


def front_totals(http_url: str) -> dict:
    """The front ends' (--frontends) request and link-round-trip histograms: (model, stage) → [count, sum], summed."""
    out: dict = {}
    for stage, kind, model, value in FRONT.findall(metrics_text(http_url)):
        out.setdefault((model, stage), [0.0, 0.0])[kind == "sum"] += float(value)
    return out


def front_delta(before: dict, after: dict, model: str) -> dict:
    """Over a run, a request's mean time in its front end and on the link (ms): where the front ends' time goes."""
    out = {}
    for stage in ("request", "link"):
        (c0, s0), (c1, s1) = before.get((model, stage), [0.0, 0.0]), after.get((model, stage), [0.0, 0.0])
        if c1 > c0:
            out[f"frontend_{stage}_ms"] = round((s1 - s0) / (c1 - c0) * 1e3, 3)
    return out


def loop_lags(http_url: str) -> dict:
    """Each server process's event-loop lag samples from /metrics: process → {count, sum, within_5ms}."""
    out: dict = {}
    for kind, le, process, value in LAG.findall(metrics_text(http_url)):
        entry = out.setdefault(process, {"count": 0.0, "sum": 0.0, "within_5ms": 0.0})
        if kind != "bucket":
            entry[kind] = float(value)
        elif le == "0.005":
            entry["within_5ms"] = float(value)
    return out


def lag_delta(before: dict, after: dict) -> dict:
    """Per process over a run: mean loop lag (ms) and the share of samples that ran more than 5 ms late."""
    out = {}
    for process, a in after.items():
        b = before.get(process, {"count": 0.0, "sum": 0.0, "within_5ms": 0.0})
        n = a["count"] - b["count"]
        if n > 0:
            out[process] = {"samples": int(n), "mean_lag_ms": round((a["sum"] - b["sum"]) / n * 1e3, 3),
                            "late_over_5ms": round(1 - (a["within_5ms"] - b["within_5ms"]) / n, 3)}
    return out


def stats_delta(before: dict, after: dict) -> dict:
    d = {k: after[k] - before[k] for k in before}
    d["answered"] = d["success"] + d["fail"]
    d["mean_batch"] = d["inference_count"] / d["execution_count"] if d["execution_count"] else None
    return d


def _stages(st: dict | None) -> str:
    """The server-side mean ms a request of a load run, stage by stage ("" without them)."""
    if not st or not st.get("requests"):
        return ""
    names = ("success", "queue", "compute_input", "compute_infer", "compute_output", "other")
    return "; server ms a request: " + ", ".join(f"{n} {st[n + '_ms']:.3f}" for n in names if n + "_ms" in st)


# ------------------------------------------------------------------ the probe


class Probe:
    def __init__(self, args):
        from benchmarks.probes.harness import Budget, facts

        self.args = args
        self.budget = Budget(args.budget_seconds)
        self.cuda = args.device == "cuda"
        self.facts = facts(args.device)
        self.facts["tritonclient"] = _version("tritonclient")
        self.facts["grpcio"] = _version("grpcio")
        self.facts["psutil"] = _version("psutil")
        self.facts["python"] = sys.version.split()[0]
        self.results: dict = {"what": "kiln serve vs the engine alone on one device (issue 24)",
                              "args": {k: str(v) for k, v in vars(args).items()}, **self.facts,
                              "models": {}, "parts": {}, "skipped": []}
        slug = "".join(c if c.isalnum() else "-" for c in str(self.facts.get("device", args.device)).lower())
        stem = f"gpu-serve{'-smoke' if args.smoke else ''}-{slug}-{self.facts['date']}"
        args.out.mkdir(parents=True, exist_ok=True)
        self.json_path, self.md_path = args.out / f"{stem}.json", args.out / f"{stem}.md"
        self.engines: dict = {}
        self.server: Server | None = None
        self.clients: Clients | None = None

    # bookkeeping

    def save(self) -> None:
        self.results["elapsed_s"] = round(self.budget.elapsed, 1)
        self.json_path.write_text(json.dumps(self.results, indent=1, default=str) + "\n")

    def part(self, name: str, fn, need_s: float = 0.0):
        """Run one part: its result (or error, or why it was skipped) recorded under `name`."""
        if any(re.search(w, name) if w[:1] == "^" or w[-1:] == "$" else w in name for w in self.args.skip):
            self.results["parts"][name] = {"skipped": "--skip"}
            self.results["skipped"].append(name)
            return None
        if self.budget.left < need_s:
            why = f"skipped: {self.budget.left:.0f} s of the budget left, the part needs ~{need_s:.0f} s"
            self.results["parts"][name] = {"skipped": why}
            self.results["skipped"].append(name)
            self.budget.log(f"{name}: {why}")
            self.save()
            return None
        self.budget.log(f"{name} ...")
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - recorded, and the other parts run
            tb = traceback.format_exc()
            print(tb, file=sys.stderr, flush=True)
            out = {"error": f"{type(e).__name__}: {e}", "traceback": tb[-3000:]}
            if self.server is not None:
                out["server_log_tail"] = self.server.tail(1500)
        self.results["parts"][name] = out
        self.budget.log(f"{name}: {_brief(out)}")
        self.save()
        return out

    # models

    def specs(self) -> dict:
        """key → (Spec, size, dynamic_seq, profile, config.toml text)."""
        from benchmarks.models import SPECS, Made, Spec, _bert

        a = self.args
        cfg = (f"max_batch_size = {MAX_BATCH}\ninstance_count = {a.instances}\n\n[dynamic_batching]\n"
               f"preferred_batch_size = {PREFERRED}\nmax_queue_delay_microseconds = {a.queue_delay_us}\n")
        if a.smoke:
            def tiny_cnn(size: int) -> Made:
                import torch

                m = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                        torch.nn.Conv2d(16, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
                                        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))
                return Made(m, "inline tiny CNN")

            tiny = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
            image, text = Spec("tinycnn", "image", tiny_cnn, 32), Spec("tinybert", "text", _bert(**tiny), 16)
            mini = Spec("tinyminilm", "text", _bert(**tiny), 16)
        else:
            image, text, mini = SPECS["resnet50"], SPECS["bert"], SPECS["minilm"]
        isz, seq = image.default_size, text.default_size
        lo, hi = a.seq_range
        text_profile = {n: ((1, seq), (MAX_BATCH, seq), (MAX_BATCH, seq)) for n in text.input_names}
        mini_profile = {n: ((1, lo), (16, min(max(lo, 128), hi)), (MAX_BATCH, hi)) for n in mini.input_names}
        return {
            "resnet50": (image, isz, False, {"input": ((1, 3, isz, isz), (MAX_BATCH, 3, isz, isz),
                                                       (MAX_BATCH, 3, isz, isz))}, cfg),
            "bert": (text, seq, False, text_profile, cfg),
            "minilm": (mini, mini.default_size, True, mini_profile, cfg),
        }

    def build(self, key: str, entry) -> dict:
        import kiln
        from benchmarks.models import instantiate, onnx_file

        spec, size, dynseq, profile, cfg = entry
        start = time.perf_counter()
        made = instantiate(spec, size)
        path, cached = onnx_file(spec, made, size, self.args.cache, dynamic_seq=dynseq)
        export_s = time.perf_counter() - start
        names = _onnx_inputs(path)
        profile = {n: r for n, r in profile.items() if n in names}
        start = time.perf_counter()
        engine = kiln.build(path, kiln.BuildConfig(profiles=(profile,), device=self.args.device, fp16=self.cuda,
                                                   timing_cache=str(self.args.cache / "timing-cache.sqlite")))
        build_s = time.perf_counter() - start
        folder = self.repo / key / "1"
        folder.mkdir(parents=True, exist_ok=True)
        engine.save(folder / "model.plan", force=True)
        inputs = [t.name for t in engine.inputs]
        if key == "minilm":
            pads = ", ".join(f"{n} = 0" for n in ("input_ids", "attention_mask", "token_type_ids") if n in inputs)
            cfg += (f"\n[dynamic_batching.padding]\naxis = 1\ninputs = {{ {pads} }}\n"
                    'outputs = ["last_hidden_state"]\n')
        (self.repo / key / "config.toml").write_text(cfg)
        copies = {}  # the same plan served under other configs
        if key in ("resnet50", "bert"):  # concurrency 1 without the queue delay
            copies[f"{key}_nodelay"] = (f"max_batch_size = {MAX_BATCH}\ninstance_count = 1\n\n[dynamic_batching]\n"
                                        "max_queue_delay_microseconds = 0\n")
        if key == "bert" and self.args.overload_queue > 0:  # a bounded queue for the overload run
            copies["bert_bounded"] = cfg + f"max_queue_size = {self.args.overload_queue}\n"
        for name, text in copies.items():
            (self.repo / name / "1").mkdir(parents=True, exist_ok=True)
            shutil.copy(folder / "model.plan", self.repo / name / "1" / "model.plan")
            (self.repo / name / "config.toml").write_text(text)
        self.engines[key] = {"spec": spec, "size": size, "engine": engine, "inputs": inputs,
                             "ctx": engine.create_context()}
        info = {"source": made.source, "fallback": made.fallback, "onnx": path.name, "onnx_cached": cached,
                "export_s": round(export_s, 1), "build_s": round(build_s, 1), "served_copies": copies,
                "timing_cache": engine.build_info.get("timing_cache"), "inputs": inputs,
                "outputs": [t.name for t in engine.outputs],
                "profile": {n: [list(s) for s in r] for n, r in profile.items()}, "config_toml": cfg}
        self.results["models"][key] = info
        return info

    # offline

    def feeds(self, key: str, batch: int, device: str | None):
        m = self.engines[key]
        spec, size = m["spec"], m["size"]
        t = {k: v for k, v in spec.inputs(batch, size).items() if k in m["inputs"]}
        if spec.task == "text":
            t = {k: (v % VOCAB_IDS if k == "input_ids" else v) for k, v in t.items()}
        if device is None:
            return {k: v.numpy() for k, v in t.items()}
        return {k: v.to(device) for k, v in t.items()}

    def offline(self, key: str) -> dict:
        from benchmarks.probes.harness import wall_ms
        from kiln.util.timing import measure

        a, ctx = self.args, self.engines[key]["ctx"]
        dev = a.device
        f64, f1, h1 = self.feeds(key, MAX_BATCH, dev), self.feeds(key, 1, dev), self.feeds(key, 1, None)
        b64 = measure(lambda: ctx.run(f64), device=dev, warmup=10, iterations=a.offline_iters).median
        b1_dev = measure(lambda: ctx.run(f1), device=dev, warmup=20, iterations=a.offline_iters * 2).median
        b1_host = wall_ms(lambda: ctx.run(h1), iters=a.offline_iters * 2, warmup=20)
        h64 = self.feeds(key, MAX_BATCH, None)
        b64_host = wall_ms(lambda: ctx.run(h64), iters=a.offline_iters, warmup=10)
        out = {"b64_ms": b64, "b64_items_per_s": MAX_BATCH / b64 * 1e3, "b1_device_ms": b1_dev,
               "b1_host_ms": b1_host, "b64_host_ms": b64_host, "b64_host_items_per_s": MAX_BATCH / b64_host * 1e3,
               "timing": f"b64 and b1 device: kiln.util.timing.measure on {dev} (median); b1 and b64 host: numpy in "
                         "-> numpy out, wall clock, median"}
        self.engines[key]["offline"] = out
        return out

    # served

    def request_feeds(self, key: str, batch: int = 1) -> dict[str, np.ndarray]:
        return self.feeds(key, batch, None)

    def conc1(self, key: str) -> dict:
        """Concurrency 1 against `key` as configured (its queue delay included) and against `key`_nodelay (no
        queue delay, one instance): "server adds" is the latter's p50 - the engine's host-input p50."""
        out = {"configured": self.conc1_model(key, key)}
        nodelay = self.conc1_model(key, f"{key}_nodelay")
        out |= nodelay | {"model": f"{key}_nodelay"}
        if self.server.http_url:
            out["http"] = self.conc1_model(key, f"{key}_nodelay", protocol="http") | {"model": f"{key}_nodelay"}
        off = self.engines[key].get("offline")
        if off:
            if "http" in out:
                out["http"]["server_adds_ms"] = out["http"]["p50_ms"] - off["b1_host_ms"]
            out["server_adds_ms"] = out["p50_ms"] - off["b1_host_ms"]
            out["server_adds_vs_device_ms"] = out["p50_ms"] - off["b1_device_ms"]
            out["configured"]["server_adds_ms"] = out["configured"]["p50_ms"] - off["b1_host_ms"]
        return out

    def conc1_model(self, key: str, model: str, protocol: str = "grpc") -> dict:
        """Sequential requests over `protocol` (grpc, or http with binary tensors): latency and the server's stages."""
        import tritonclient.grpc as gc
        import tritonclient.http as hc

        from kiln.serve.dtypes import numpy_to_v2

        mod = gc if protocol == "grpc" else hc
        client = mod.InferenceServerClient(self.server.url if protocol == "grpc" else self.server.http_url)
        try:
            ins = []
            for name, value in self.request_feeds(key).items():
                inp = mod.InferInput(name, list(value.shape), numpy_to_v2(value.dtype))
                inp.set_data_from_numpy(value, **({} if protocol == "grpc" else {"binary_data": True}))
                ins.append(inp)
            for _ in range(30):
                client.infer(model, ins)
            before = stage_totals(self.server.url, model)
            ms = []
            for _ in range(self.args.requests):
                t = time.perf_counter()
                client.infer(model, ins)
                ms.append((time.perf_counter() - t) * 1e3)
            server = stage_means(before, stage_totals(self.server.url, model))
        finally:
            client.close()
        ms = np.asarray(ms)
        out = {"requests": len(ms), "p50_ms": float(np.median(ms)), "p99_ms": _pct(ms, 99),
               "mean_ms": float(ms.mean()), "server": server}
        if server["success_ms"] is not None:
            out["outside_server_p50_ms"] = out["p50_ms"] - server["success_ms"]
            out["outside_server_mean_ms"] = out["mean_ms"] - server["success_ms"]
        return out

    def load(self, model: str, feeds: dict, concurrency: int, *, duration: float | None = None,
             requests: int | None = None, shared_memory: str = "none", protocol: str = "grpc") -> dict:
        """`concurrency` batch-1 clients over the client processes; combined report + server statistics delta.
        `shared_memory` "system" / "cuda": tensors pass through the clients' POSIX / GPU shared memory regions;
        `protocol` grpc or http (binary tensors)."""
        per = split(concurrency, self.args.clients)
        url = self.server.url if protocol == "grpc" else self.server.http_url
        wanted = self.args.outputs.get(model.removesuffix("_nodelay"))
        jobs = [{"kind": "fixed", "url": url, "model": model, "feeds": feeds, "concurrency": c, "protocol": protocol,
                 "duration": duration, "shared_memory": shared_memory, "outputs": wanted} for c in per]
        if requests is not None:
            for job, n in zip(jobs, split(requests, len(per))):
                job |= {"duration": None, "requests": n}
        before, stages = statistics(self.server.url, model), stage_totals(self.server.url, model)
        lags, fronts = loop_lags(self.server.http_url), front_totals(self.server.http_url)
        parts = self.clients.run(jobs, timeout_s=(duration or 0) + 300)
        out = combine(parts) | {"concurrency": concurrency, "per_process_concurrency": per, "asked_outputs": wanted}
        out["loop_lag"] = lag_delta(lags, loop_lags(self.server.http_url))
        out["frontends"] = front_delta(fronts, front_totals(self.server.http_url), model)
        out["server"] = stats_delta(before, statistics(self.server.url, model))
        out["server_stages"] = stage_means(stages, stage_totals(self.server.url, model))
        out["mean_batch"] = out["server"]["mean_batch"]
        out["client_answered_minus_server_counted"] = out["requests"] - out["server"]["answered"]
        return out

    def throughput(self, key: str, shared_memory: str = "none", protocol: str = "grpc") -> dict:
        a = self.args
        feeds = self.request_feeds(key)
        self.load(key, feeds, a.concurrency, duration=a.warmup_seconds, shared_memory=shared_memory,
                  protocol=protocol)
        out = self.load(key, feeds, a.concurrency, duration=a.duration, shared_memory=shared_memory,
                        protocol=protocol)
        out["shared_memory"], out["protocol"] = shared_memory, protocol
        return out | self.ratios(key, out["infer_per_s"])

    def ratios(self, key: str, per_s: float) -> dict:
        """Served requests/s over the engine's offline batch-64 items/s, device-resident and host tensors."""
        off = self.engines[key].get("offline") or {}
        return {name: per_s / off[k] for name, k in (("ratio_to_offline_b64", "b64_items_per_s"),
                                                     ("ratio_to_offline_b64_host", "b64_host_items_per_s"))
                if off.get(k)}

    def perf_analyzer(self, key: str, model: str, protocol: str, concurrency: int, shm: str = "none") -> dict:
        """NVIDIA's perf_analyzer (C++, --perf-analyzer) at `concurrency` over `protocol`, tensors through `shm` shared
        memory (none, system, cuda): batch-1 requests of zeros, its infer/s and latency percentiles (its CSV, µs →
        ms), and the server's statistics over the run."""
        a = self.args
        csv = a.out / f"pa-{model}-{protocol}-c{concurrency}-{shm}.csv"
        url = (self.server.url if protocol == "grpc" else self.server.http_url).removeprefix("http://")
        command = [str(a.perf_analyzer), "-m", model, "-u", url, "-i", protocol, "-b", "1",
                   "--concurrency-range", str(concurrency), "--input-data", "zero", "--measurement-interval",
                   str(int(a.duration * 1000 / 2)), "--max-trials", "4", "--stability-percentage", "25", "-f", str(csv),
                   "--shared-memory", shm, *a.perf_analyzer_args.split()]
        before, lags = statistics(self.server.url, model), loop_lags(self.server.http_url)
        fronts = front_totals(self.server.http_url)
        run = subprocess.run(command, capture_output=True, text=True, timeout=a.duration * 6 + 60)
        if run.returncode != 0:  # exit -9 at concurrency 64 in stops 42-43: keep what may say why
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            kernel = subprocess.run(["dmesg"], capture_output=True, text=True).stdout[-800:]
            raise RuntimeError(f"perf_analyzer exit {run.returncode} (children's peak RSS {peak / 1024:.0f} MB; "
                               f"dmesg tail: {kernel!r}): {(run.stdout + run.stderr)[-1500:]}")
        lines = csv.read_text().splitlines()
        row = dict(zip(lines[0].split(","), lines[1].split(",")))
        us = {k: float(v) for k, v in row.items() if k.endswith("latency") and v}
        out = {"command": " ".join(command), "protocol": protocol, "concurrency": concurrency, "shared_memory": shm,
               "infer_per_s": float(row["Inferences/Second"]),
               "p50_ms": us.get("p50 latency", 0) / 1e3, "p99_ms": us.get("p99 latency", 0) / 1e3,
               "stdout_tail": run.stdout[-1200:]}
        out["server"] = stats_delta(before, statistics(self.server.url, model))
        out["loop_lag"] = lag_delta(lags, loop_lags(self.server.http_url))
        out["frontends"] = front_delta(fronts, front_totals(self.server.http_url), model)
        out["mean_batch"] = out["server"]["mean_batch"]
        off = self.engines[key].get("offline") or {}
        if concurrency == 1 and off.get("b1_host_ms"):
            out["server_adds_ms"] = out["p50_ms"] - off["b1_host_ms"]
            out["server_adds_vs_device_ms"] = out["p50_ms"] - off["b1_device_ms"]  # the engine on device-resident data
        return out | self.ratios(key, out["infer_per_s"])

    def overload(self) -> dict:
        a = self.args
        model = "bert_bounded" if a.overload_queue > 0 else "bert"
        out = self.load(model, self.request_feeds("bert"), 2 * a.concurrency, duration=a.overload_duration)
        out["model"] = model
        out["max_queue_size"] = a.overload_queue
        out["lost_or_duplicated"] = out["client_answered_minus_server_counted"]
        out["note"] = ("loadgen records every request it sends exactly once (success or error), so client sent == "
                       "answered by construction; lost_or_duplicated compares the client's answered count with the "
                       "requests the server counted (statistics success + fail)")
        out["server_alive_after"] = self.server.proc.poll() is None
        return out

    def minilm(self) -> dict:
        a = self.args
        lo, hi = a.seq_range
        names = self.engines["minilm"]["inputs"]
        per = split(a.minilm_concurrency, a.clients)
        jobs = [{"kind": "varlen", "url": self.server.url, "model": "minilm", "names": names, "lo": lo, "hi": hi,
                 "concurrency": c, "duration": a.warmup_seconds, "seed": i} for i, c in enumerate(per)]
        self.clients.run(jobs, timeout_s=a.warmup_seconds + 300)
        before = statistics(self.server.url, "minilm")
        parts = self.clients.run([j | {"duration": a.minilm_duration, "seed": 100 + j["seed"]} for j in jobs],
                                 timeout_s=a.minilm_duration + 300)
        out = combine(parts) | {"concurrency": a.minilm_concurrency, "per_process_concurrency": per,
                                "seq_range": [lo, hi]}
        out["server"] = stats_delta(before, statistics(self.server.url, "minilm"))
        out["mean_batch"] = out["server"]["mean_batch"]
        out["sent_minus_answered"] = out["sent"] - out["requests"]
        out["check"] = self.minilm_check(names, lo, hi)
        return out

    def minilm_check(self, names: list[str], lo: int, hi: int, n: int = 16) -> dict:
        """`n` concurrent requests of different lengths (merged and padded by the server) against the engine alone."""
        import tritonclient.grpc as gc

        rng = np.random.default_rng(7)
        lengths = sorted({int(x) for x in rng.integers(lo, hi + 1, 4 * n)})[:n]
        rng.shuffle(lengths)
        ids = [rng.integers(1, VOCAB_IDS, (1, L), dtype=np.int64) for L in lengths]
        answers: list = [None] * len(ids)
        barrier = threading.Barrier(len(ids))
        outs = [t.name for t in self.engines["minilm"]["engine"].outputs]
        before = statistics(self.server.url, "minilm")

        def one(i: int) -> None:
            client = gc.InferenceServerClient(self.server.url)
            try:
                ins = _token_inputs(gc, names, None, lengths[i], ids[i])
                barrier.wait(30)
                r = client.infer("minilm", ins)
                answers[i] = {o: r.as_numpy(o) for o in outs}
            except Exception as e:  # noqa: BLE001 - recorded per request
                answers[i] = e
            finally:
                client.close()

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ids))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        ctx = self.engines["minilm"]["ctx"]
        diffs, errors = [], []
        for i, ans in enumerate(answers):
            if not isinstance(ans, dict):
                errors.append(f"length {lengths[i]}: {ans!r}"[:300])
                continue
            vals = {"input_ids": ids[i], "attention_mask": np.ones_like(ids[i]),
                    "token_type_ids": np.zeros_like(ids[i])}
            ref = ctx.run({k: vals[k] for k in names})
            d = {}
            for o, v in ans.items():
                r = np.asarray(ref[o])
                if v.shape != r.shape:
                    d[o] = f"shape {list(v.shape)} != engine's {list(r.shape)}"
                else:
                    d[o] = float(np.max(np.abs(v.astype(np.float64) - r.astype(np.float64))))
            diffs.append({"length": lengths[i], **d})
        nums = [v for d in diffs for k, v in d.items() if k != "length" and isinstance(v, float)]
        return {"requests": len(ids), "lengths": lengths, "errors": errors,
                "server": stats_delta(before, statistics(self.server.url, "minilm")),
                "max_abs_diff": max(nums) if nums else None,
                "shape_mismatches": [d for d in diffs if any(isinstance(v, str) for v in d.values())],
                "per_request": diffs}

    def memory(self) -> dict:
        a = self.args
        pid = self.server.proc.pid
        seq = 16 if not a.smoke else min(16, a.seq_range[1])
        names = self.engines["minilm"]["inputs"]
        ids = np.random.default_rng(3).integers(1, VOCAB_IDS, (1, seq), dtype=np.int64)
        feeds = {k: v for k, v in {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                   "token_type_ids": np.zeros_like(ids)}.items() if k in names}
        samples = []

        def sample(label: str, sent: int) -> None:
            samples.append({"at": label, "requests_sent": sent, "rss_mb": rss_mb(pid), "gpu_mb": gpu_mb(pid),
                            "t_s": round(self.budget.elapsed, 1)})

        sample("start", 0)
        warm = max(a.concurrency * 20, a.memory_requests // 50)
        w = self.load("minilm", feeds, a.concurrency, requests=warm)
        rate = w["infer_per_s"]
        sample("after warm-up", warm)
        # the warm-up's rate includes first calls and graph captures: each chunk is sent while the rate of the one
        # before says it ends in time
        deadline = time.monotonic() + min(a.memory_seconds, self.budget.left - 30)
        sent, runs, capped = 0, [], None
        for i, n in enumerate(split(a.memory_requests, 10)):
            if time.monotonic() + n / max(rate, 1e-9) + 0.5 > deadline:
                capped = a.memory_requests
                self.budget.log(f"memory: {rate:.0f} req/s: the next {n} requests would overrun "
                                f"--memory-seconds; stopping at {sent}")
                break
            r = self.load("minilm", feeds, a.concurrency, requests=n)
            sent += n
            rate = r["infer_per_s"]
            runs.append({k: r[k] for k in ("requests", "succeeded", "failed", "infer_per_s", "p50_ms", "p99_ms")})
            sample(f"{(i + 1) * 10}%", sent)
        total = sent
        rss = [s["rss_mb"] for s in samples]
        out = {"requests_used": total, "requests_asked": a.memory_requests, "capped_from": capped, "seq": seq,
               "warm_up_requests": warm, "warm_up_rate_per_s": rate, "samples": samples, "chunks": runs,
               "failed": sum(r["failed"] for r in runs), "rss_source": "psutil" if self.facts["psutil"] else "/proc"}
        if rss[1] is not None and rss[-1] is not None:
            out["rss_growth_after_warmup_mb"] = rss[-1] - rss[1]
            out["rss_max_minus_warmup_mb"] = max(r for r in rss[1:] if r is not None) - rss[1]
        g = [s["gpu_mb"] for s in samples]
        if isinstance(g[1], float) and isinstance(g[-1], float):
            out["gpu_growth_after_warmup_mb"] = g[-1] - g[1]
        return out

    # the run

    def run(self) -> None:
        a = self.args
        print(json.dumps({k: self.facts.get(k) for k in ("device", "date", "torch", "triton", "kiln")}), flush=True)
        self.repo = Path(tempfile.mkdtemp(prefix="kiln-serve-probe-")) / "models"
        self.repo.mkdir(parents=True)
        try:
            self.clients = Clients(a.clients)
            for key, entry in self.specs().items():
                if key not in a.models:
                    continue
                self.part(f"build {key}", lambda k=key, e=entry: self.build(k, e), need_s=30)
            for key in ("resnet50", "bert"):
                if key in self.engines:
                    self.part(f"offline {key}", lambda k=key: self.offline(k), need_s=10)
            self.part("server start", self.start_server, need_s=30)
            if self.server is not None and self.server.url:
                for key in ("resnet50", "bert"):
                    if key in self.engines:
                        self.part(f"c1 {key}", lambda k=key: self.conc1(k), need_s=10)
                for key in ("resnet50", "bert"):
                    if key in self.engines:
                        for proto in a.protocols:
                            name = f"c{a.concurrency} {key}" + ("" if proto == "grpc" else f" {proto}")
                            self.part(name, lambda k=key, p=proto: self.throughput(k, protocol=p),
                                      need_s=a.duration + a.warmup_seconds + 10)
                        if a.shared_memory:
                            self.part(f"c{a.concurrency} {key} shm",
                                      lambda k=key: self.throughput(k, a.client_shared_memory),
                                      need_s=a.duration + a.warmup_seconds + 10)
                if a.perf_analyzer:
                    for key in ("resnet50", "bert"):
                        for proto in a.protocols:
                            for shm in a.perf_analyzer_shm:
                                if key not in self.engines:
                                    continue
                                via = "" if shm == "none" else f" {shm}-shm"
                                for c, model in ((1, f"{key}_nodelay"), (a.concurrency, key)):
                                    self.part(f"perf_analyzer c{c} {key} {proto}{via}",
                                              lambda k=key, m=model, p=proto, c=c, s=shm: self.perf_analyzer(k, m, p,
                                                                                                          c, s),
                                              need_s=a.duration * 2 + 10)
                if "bert" in self.engines:
                    self.part(f"overload c{2 * a.concurrency} bert", self.overload, need_s=a.overload_duration + 10)
                if "minilm" in self.engines:
                    self.part("minilm varlen", self.minilm, need_s=a.minilm_duration + a.warmup_seconds + 15)
                    self.part("memory", self.memory, need_s=40 if not a.smoke else 5)
            else:
                self.results["skipped"].append("every served part: the server did not start")
        finally:
            if self.server is not None:
                code = self.server.stop()
                self.results["server_exit"] = code
                self.results["server_log_tail"] = self.server.tail(2000)
            if self.clients is not None:
                self.clients.close()
            shutil.rmtree(self.repo.parent, ignore_errors=True)
            self.save()
            try:
                md = self.markdown()
            except Exception:  # noqa: BLE001 - the JSON holds everything
                md = f"(markdown failed)\n```\n{traceback.format_exc()}```\n"
            self.md_path.write_text(md)
            print(f"\nwrote {self.json_path} and {self.md_path}\n\n{md}", flush=True)

    def start_server(self) -> dict:
        self.server = Server(self.repo, self.args, self.args.out / "serve.log")
        models = sorted(p.name for p in self.repo.iterdir() if p.is_dir())
        ready_s = self.server.wait_ready(models, self.args.server_timeout)
        return {"command": self.server.command, "grpc": self.server.url, "ready_s": ready_s, "models": models,
                "pid": self.server.proc.pid, "rss_mb": rss_mb(self.server.proc.pid)}

    def markdown(self) -> str:
        r, a, p = self.results, self.args, self.results["parts"]
        c = a.concurrency
        f = (lambda v, d=2: "-" if v is None else f"{v:.{d}f}")  # noqa: E731
        lines = [f"# kiln serve on {r.get('device')} ({r['date']}{', SMOKE: tiny models' if a.smoke else ''})", "",
                 f"kiln {r.get('kiln')}, torch {r.get('torch')}, triton {r.get('triton')}, tritonclient "
                 f"{r.get('tritonclient')}; fp16 engines, max_batch_size {MAX_BATCH}, preferred {PREFERRED}, queue "
                 f"delay {a.queue_delay_us} µs, {a.instances} instances, --workers {a.workers}; concurrency 1 over "
                 f"gRPC and HTTP, concurrency runs over {' and '.join(a.protocols)}; load from {a.clients} client "
                 f"processes (kiln.cli.loadgen.run_load), {a.duration:g} s. `python -m benchmarks.probes.gpu_serve`.",
                 "", f"| model | offline b{MAX_BATCH} items/s | engine b1 ms host / device | c1 p50 / p99 ms "
                 f"(no delay) | server adds ms | c1 p50 ms with the {a.queue_delay_us} µs delay | c{c} infer/s | "
                 f"c{c} p50 / p99 ms | ÷ offline | mean batch | failed |",
                 "|---|---|---|---|---|---|---|---|---|---|---|"]
        for key in ("resnet50", "bert"):
            off, one, many = (p.get(n) or {} for n in (f"offline {key}", f"c1 {key}", f"c{c} {key}"))
            lines.append(
                f"| {key} | {f(off.get('b64_items_per_s'), 0)} | {f(off.get('b1_host_ms'), 3)} / "
                f"{f(off.get('b1_device_ms'), 3)} | {f(one.get('p50_ms'), 3)} / {f(one.get('p99_ms'), 3)} | "
                f"{f(one.get('server_adds_ms'), 3)} | {f(one.get('configured', {}).get('p50_ms'), 3)} | "
                f"{f(many.get('infer_per_s'), 0)} | {f(many.get('p50_ms'))} / "
                f"{f(many.get('p99_ms'))} | {f(many.get('ratio_to_offline_b64'))} | {f(many.get('mean_batch'), 1)} | "
                f"{many.get('failed', '-')} |")
        lines += ["", "Concurrency 1, server side (Triton statistics over the measured requests, mean ms per request; "
                  "other = success less the four stages: hand-offs to / from the engine thread and the event loop; "
                  "outside = client latency less the server's success, i.e. client, network and gRPC stack):", "",
                  "| model | client p50 / mean | success | queue | compute_input | compute_infer | compute_output | "
                  "other | outside p50 / mean |", "|---|---|---|---|---|---|---|---|---|"]
        for key in ("resnet50", "bert"):
            one = p.get(f"c1 {key}") or {}
            for row in (one, one.get("configured") or {}, one.get("http") or {}):
                sv = row.get("server")
                if not sv:
                    continue
                name = row.get("model", key) + (" (HTTP binary)" if row is one.get("http") else "")
                lines.append(
                    f"| {name} | {f(row.get('p50_ms'), 3)} / {f(row.get('mean_ms'), 3)} | "
                    + " | ".join(f(sv.get(f"{k}_ms"), 3) for k in STAGES) + f" | {f(sv.get('other_ms'), 3)} | "
                    f"{f(row.get('outside_server_p50_ms'), 3)} / {f(row.get('outside_server_mean_ms'), 3)} |")
        lines.append("")
        for key in ("resnet50", "bert"):
            shm = p.get(f"c{c} {key} shm") or {}
            if "infer_per_s" in shm:
                lines.append(f"- {key}, concurrency {c} with inputs and outputs in system shared memory: "
                             f"{shm['infer_per_s']:.0f} infer/s, p50 {f(shm['p50_ms'])} / p99 {f(shm['p99_ms'])} ms, "
                             f"÷ offline {f(shm.get('ratio_to_offline_b64'))}, mean batch {f(shm['mean_batch'], 1)}, "
                             f"failed {shm['failed']}")
            off = p.get(f"offline {key}") or {}
            if off.get("b64_host_items_per_s"):
                lines.append(f"- {key}, the engine alone at batch {MAX_BATCH} with host tensors (numpy in, numpy out): "
                             f"{off['b64_host_items_per_s']:.0f} items/s")
            runs = [(n, v) for n, v in p.items() if isinstance(v, dict) and "infer_per_s" in v
                    and (n == f"c{c} {key} http" or n.startswith("perf_analyzer ") and f" {key} " in n)]
            for n, v in runs:
                adds = f", server adds {f(v['server_adds_ms'], 3)} ms" if v.get("server_adds_ms") is not None else ""
                lines.append(f"- {n}: {v['infer_per_s']:.0f} infer/s, p50 {f(v['p50_ms'], 3)} / p99 "
                             f"{f(v['p99_ms'], 3)} ms{adds}, ÷ offline {f(v.get('ratio_to_offline_b64'))} (host "
                             f"tensors {f(v.get('ratio_to_offline_b64_host'))}), mean batch {f(v.get('mean_batch'), 1)}"
                             + (f", failed {v['failed']}" if "failed" in v else "") + _stages(v.get("server_stages")))
        o = p.get(f"overload c{2 * c} bert") or {}
        if "infer_per_s" in o:
            lines.append(f"- overload: {o['model']} (max_queue_size {o['max_queue_size']}) at concurrency {2 * c}: "
                         f"{o['infer_per_s']:.0f} infer/s, {o['succeeded']} ok, {o['failed']} failed {o['errors']}, "
                         f"server counted {o['server']['answered']}; lost or duplicated "
                         f"{o['lost_or_duplicated']}; server alive after: {o['server_alive_after']}")
        m = p.get("minilm varlen") or {}
        if "infer_per_s" in m:
            ck = m.get("check", {})
            lines.append(f"- minilm, seq {m['seq_range'][0]}..{m['seq_range'][1]} per request, concurrency "
                         f"{m['concurrency']}: {m['infer_per_s']:.0f} infer/s, p50 {f(m['p50_ms'])} / p99 "
                         f"{f(m['p99_ms'])} ms, mean batch {f(m['mean_batch'], 1)}, failed {m['failed']}, "
                         f"sent - answered {m['sent_minus_answered']}; {ck.get('requests')} concurrent requests vs "
                         f"the engine alone: max abs diff {f(ck.get('max_abs_diff'), 4)} (mean batch "
                         f"{f(ck.get('server', {}).get('mean_batch'), 1)}, errors {len(ck.get('errors', []))}, shape "
                         f"mismatches {len(ck.get('shape_mismatches', []))})")
        mem = p.get("memory") or {}
        if "samples" in mem:
            series = ", ".join(f"{s['at']} {f(s['rss_mb'], 0)}" for s in mem["samples"])
            picks = [s for i, s in enumerate(mem["samples"]) if i in (0, 1, 6, len(mem["samples"]) - 1)]
            gpu = ", ".join(f"{s['at']} {s['gpu_mb'] if not isinstance(s['gpu_mb'], float) else f(s['gpu_mb'], 0)}"
                            for s in picks)
            cap = f" (capped from {mem['capped_from']})" if mem.get("capped_from") else ""
            lines.append(f"- memory: {mem['requests_used']} minilm seq-{mem['seq']} requests{cap}, failed "
                         f"{mem['failed']}; server RSS MiB: {series}; growth after warm-up "
                         f"{f(mem.get('rss_growth_after_warmup_mb'), 1)} MiB; GPU MiB: {gpu}; GPU growth "
                         f"{f(mem.get('gpu_growth_after_warmup_mb'), 0)} MiB")
        bad = {k: v.get("error") or v.get("skipped") for k, v in p.items()
               if isinstance(v, dict) and ("error" in v or "skipped" in v)}
        for k, v in bad.items():
            lines.append(f"- {k}: {str(v).splitlines()[0][:300]}")
        lines.append(f"- total {r.get('elapsed_s')} s of a {a.budget_seconds:g} s budget")
        return "\n".join(lines) + "\n"


def _onnx_inputs(path: Path) -> list[str]:
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    init = {i.name for i in g.initializer}
    return [i.name for i in g.input if i.name not in init]


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _brief(out) -> str:
    if not isinstance(out, dict):
        return str(out)[:200]
    if "error" in out:
        return out["error"].splitlines()[0][:300]
    keys = ("b64_items_per_s", "b1_host_ms", "b1_device_ms", "build_s", "ready_s", "p50_ms", "p99_ms",
            "server_adds_ms", "infer_per_s", "mean_batch", "failed", "ratio_to_offline_b64", "lost_or_duplicated",
            "max_abs_diff", "rss_growth_after_warmup_mb", "requests_used")
    brief = [f"{k} {out[k]:.4g}" if isinstance(out[k], float) else f"{k} {out[k]}"
             for k in keys if k in out and out[k] is not None]
    brief += [f"{k.replace('_', ' ')} {v}" for k, v in (out.get("frontends") or {}).items()]
    brief += [f"loop lag {p} {v['mean_lag_ms']} ms ({v['late_over_5ms']:.0%} > 5 ms)"
              for p, v in (out.get("loop_lag") or {}).items()]
    return ", ".join(brief)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the JSON, markdown and server log")
    ap.add_argument("--cache", type=Path, default=ROOT / ".kiln-cache" / "benchmarks",
                    help="ONNX exports and the timing cache")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--smoke", action="store_true", help="tiny models, short runs (for a CPU check of the probe)")
    ap.add_argument("--budget-seconds", type=float, default=480.0)
    ap.add_argument("--queue-delay-us", type=int, default=2000, help="max_queue_delay_microseconds")
    ap.add_argument("--instances", type=int, default=2, help="instance_count of every model")
    ap.add_argument("--clients", type=int, default=8, help="client processes for the load runs")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of each throughput run")
    ap.add_argument("--warmup-seconds", type=float, default=3.0, help="load before each throughput run")
    ap.add_argument("--overload-duration", type=float, default=5.0)
    ap.add_argument("--overload-queue", type=int, default=32,
                    help="max_queue_size of bert_bounded (bert's plan) for the overload run; 0: run it against bert")
    ap.add_argument("--minilm-concurrency", type=int, default=16)
    ap.add_argument("--minilm-duration", type=float, default=None, help="default: --duration")
    ap.add_argument("--seq-range", type=int, nargs=2, default=None, metavar=("LO", "HI"),
                    help="minilm's sequence range (default 8 256)")
    ap.add_argument("--requests", type=int, default=500, help="requests at concurrency 1")
    ap.add_argument("--offline-iters", type=int, default=100)
    ap.add_argument("--memory-requests", type=int, default=100_000)
    ap.add_argument("--memory-seconds", type=float, default=75.0, help="cap the memory run to about this long")
    ap.add_argument("--server-timeout", type=float, default=300.0, help="seconds for the server to get ready")
    ap.add_argument("--models", type=lambda v: v.split(","), default=["resnet50", "bert", "minilm"],
                    help="comma-separated models to build and serve")
    ap.add_argument("--skip", type=lambda v: v.split(","), default=[],
                    help="comma-separated words: parts whose name holds one are skipped (e.g. overload,memory); "
                         "a word starting with ^ or ending with $ is a regular expression (^c1 , grpc$)")
    ap.add_argument("--shared-memory", action="store_true",
                    help="also run each concurrency load with inputs and outputs in system shared memory")
    ap.add_argument("--server-prefix", default="",
                    help="a command the server runs under, e.g. 'py-spy record --format raw -o F --'")
    ap.add_argument("--workers", type=int, default=1, help="kiln serve --workers (server processes)")
    ap.add_argument("--server-args", default="", help="more kiln serve options, e.g. '--gil-switch-us 5000'")
    ap.add_argument("--protocols", type=lambda v: v.split(","), default=["grpc"],
                    help="comma-separated protocols of the concurrency runs: grpc, http (binary tensors)")
    ap.add_argument("--perf-analyzer", type=Path, default=None,
                    help="NVIDIA perf_analyzer binary (tritonclient's wheel): also load the server with it")
    ap.add_argument("--perf-analyzer-args", default="", help="more perf_analyzer options, e.g. '--async'")
    ap.add_argument("--client-shared-memory", default="system", choices=("system", "cuda"),
                    help="what the Python clients' shared memory run uses (with --shared-memory)")
    ap.add_argument("--perf-analyzer-shm", type=lambda v: v.split(","), default=["none"],
                    help="perf_analyzer runs once per listed --shared-memory kind (none, system, cuda); any but none "
                         "needs --shared-memory (the server's flag)")
    ap.add_argument("--outputs", type=_outputs_arg, default={},
                    help="model=out1+out2,...: the load runs ask only for these outputs (e.g. bert=pooler_output)")
    ap.add_argument("--grpc-port", type=int, default=0, help="0: a free one")
    ap.add_argument("--http-port", type=int, default=0, help="0: a free one")
    args = ap.parse_args()
    if args.smoke:
        given = set(a.split("=")[0] for a in sys.argv[1:])
        for flag, value in (("--clients", 2), ("--concurrency", 8), ("--duration", 2.0), ("--warmup-seconds", 0.5),
                            ("--overload-duration", 1.5), ("--minilm-concurrency", 4), ("--requests", 60),
                            ("--offline-iters", 10), ("--memory-requests", 2000), ("--memory-seconds", 12.0),
                            ("--seq-range", [8, 32]), ("--server-timeout", 120.0)):
            if flag not in given:
                setattr(args, flag[2:].replace("-", "_"), value)
    args.seq_range = args.seq_range or [8, 256]
    args.minilm_duration = args.minilm_duration or args.duration
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("--device cuda but torch sees no GPU; use --device cpu (with --smoke)")
    Probe(args).run()


if __name__ == "__main__":
    main()
