"""Probe: `kiln.compile(module, example_inputs, fp16=True)` against exporting the module to ONNX and `kiln.build`ing
that, with torch eager fp16 and torch.compile(mode="reduce-overhead") fp16 as reference peers (issue 28).

For ResNet-50 (torchvision, random weights; tests/models/vision.py without torchvision) and BERT-base
(transformers BertModel(BertConfig()), random weights, seq 128, last hidden state) at batch 1 and 64, each way is
timed by kiln.util.timing.measure (CUDA events, warm-up, median) on the same inputs; the table gives median ms,
compile ÷ build, each output's cosine against eager fp32, and build (compile) seconds. Rows past --budget-seconds
are skipped (and say so); the timing cache in --cache makes a second run quick.

    PYTHONPATH=src:. python -m benchmarks.probes.gpu_compile_vs_build --out /tmp/cvb --cache /tmp/kiln-probe-cache
    PYTHONPATH=src:. python -m benchmarks.probes.gpu_compile_vs_build --smoke --device cpu --out /tmp/cvb

--smoke: a tiny CNN and a tiny BERT at batch 1 and 2 (on the CPU: eager is the only peer unless --peers says more).
Writes OUT/compile-vs-build-DEVICE.json and .md.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

import kiln
from benchmarks.probes import harness
from kiln.util.timing import measure

PEERS = ("eager", "reduce-overhead")


@dataclass
class Case:
    """One model: its fp32 module on the CPU and a maker of its inputs (a dict of CPU tensors) at a batch size."""

    name: str
    module: torch.nn.Module
    inputs: Callable[[int], dict[str, torch.Tensor]]
    source: str


class TinyCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(torch.relu(self.conv2(y)).mean(dim=(2, 3)))


def _images(size: int) -> Callable[[int], dict[str, torch.Tensor]]:
    return lambda b: {"x": torch.randn(b, 3, size, size, generator=torch.Generator().manual_seed(b))}


def _tokens(seq: int, vocab: int) -> Callable[[int], dict[str, torch.Tensor]]:
    def make(b: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab, (b, seq), generator=torch.Generator().manual_seed(b))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    return make


def _bert(smoke: bool) -> Case:
    import transformers
    from transformers import BertConfig, BertModel

    from tests.models.text import LastHidden

    cfg = BertConfig(vocab_size=500, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64) if smoke else BertConfig()
    torch.manual_seed(0)
    module = LastHidden(BertModel(cfg, add_pooling_layer=False), pooled=False).eval()
    return Case("bert-tiny" if smoke else "bert-base", module, _tokens(8 if smoke else 128, cfg.vocab_size),
                f"transformers {transformers.__version__}")


def _resnet50() -> Case:
    from benchmarks.models import SPECS, instantiate

    made = instantiate(SPECS["resnet50"], 224)
    return Case("resnet50", made.module, _images(224), made.source + (f" ({made.fallback})" if made.fallback else ""))


def cases(smoke: bool) -> list[Case]:
    if smoke:
        torch.manual_seed(0)
        return [Case("tiny-cnn", TinyCNN().eval(), _images(16), f"torch {torch.__version__}"), _bert(True)]
    return [_resnet50(), _bert(False)]


def _on(inputs: dict[str, torch.Tensor], device: str, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    return {k: v.to(device=device, dtype=dtype if dtype is not None and v.is_floating_point() else v.dtype)
            for k, v in inputs.items()}


def _first(out) -> torch.Tensor:
    """The first tensor of a result (a tensor, tuple, dict or ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        return _first(next(iter(out.values())))
    return _first(out[0])


def _time(fn: Callable[[], object], device: str, iterations: int) -> float:
    with torch.no_grad():
        return measure(fn, device=device, warmup=max(3, iterations // 5), iterations=iterations).median


def _eager_reasons(context) -> list[str]:
    """Why a context ran some signature without its CUDA graph (empty: every signature replayed a graph)."""
    graphs = getattr(context, "graphs", None)
    return sorted(set(graphs.eager.values())) if graphs is not None else []


def _timed_build(make: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    value = make()
    harness.sync()
    return value, time.perf_counter() - start


def run_case(case: Case, batch: int, args, cache: Path) -> dict:
    """One row: kiln.compile, export + kiln.build, and the peers, each timed on the same inputs."""
    device, timing_cache = args.device, str(cache / "timing.db")
    feeds = case.inputs(batch)
    module = copy.deepcopy(case.module).to(device).eval()
    on_device = _on(feeds, device)
    with torch.no_grad():
        reference = _first(module(**on_device)).float()
    row: dict = {"model": case.name, "batch": batch, "source": case.source}

    compiled, row["compile_s"] = _timed_build(lambda: kiln.compile(module, on_device, fp16=True, device=device,
                                                                   timing_cache=timing_cache))
    row["compile_ms"] = _time(lambda: compiled(**on_device), device, args.iterations)
    with torch.no_grad():
        row["compile_cosine"] = harness.cosine(_first(compiled(**on_device)), reference)

    onnx_path = cache / f"{case.name}-b{batch}-torch{torch.__version__.replace('+', '-')}.onnx"
    start = time.perf_counter()
    if not onnx_path.is_file():
        names = list(feeds)
        with torch.no_grad():
            program = torch.onnx.export(module, (), kwargs=on_device, dynamo=True, input_names=names,
                                         verbose=False)
        program.save(str(onnx_path))
    row["export_s"] = time.perf_counter() - start
    shapes = {k: tuple(v.shape) for k, v in feeds.items()}
    engine, row["build_s"] = _timed_build(lambda: kiln.build(str(onnx_path), kiln.BuildConfig.with_shapes(
        shapes, fp16=True, device=device, timing_cache=timing_cache)))
    context = engine.create_context()
    known = set(engine.network.inputs)
    engine_feeds = {k: v for k, v in on_device.items() if k in known}
    row["build_ms"] = _time(lambda: context.run(engine_feeds), device, args.iterations)
    with torch.no_grad():
        row["build_cosine"] = harness.cosine(_first(context.run(engine_feeds)), reference)
    row["compile_over_build"] = row["compile_ms"] / row["build_ms"]
    row["eager_reasons"] = {"build": _eager_reasons(context),
                            "compile": [r for e in compiled.engines.values() for r in _eager_reasons(e.context)]}

    for peer in args.peers:
        half = copy.deepcopy(case.module).to(device=device, dtype=torch.float16).eval()
        inputs = _on(feeds, device, torch.float16)
        fn: Callable = half
        if peer != "eager":
            torch._dynamo.reset()
            fn = torch.compile(half, mode=peer)
        call = lambda: fn(**inputs)  # noqa: E731
        with torch.no_grad():
            _, row[f"{peer}_first_s"] = _timed_build(call)
            row[f"{peer}_ms"] = _time(call, device, args.iterations)
            row[f"{peer}_cosine"] = harness.cosine(_first(call()), reference)
    return row


def render(results: dict) -> str:
    """The rows as a markdown table (ms: medians; cos: cosine of the first output against eager fp32)."""
    peers = results["peers"]
    head = ["model", "batch", "compile ms", "build ms", "compile ÷ build", *(f"{p} ms" for p in peers),
            "compile cos", "build cos", "compile s", "export s", "build s"]
    lines = [f"# kiln.compile vs export + kiln.build, fp16 ({results['device']}, {results['date']})", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results["rows"]:
        if "skipped" in r:
            lines.append(f"| {r['model']} | {r['batch']} | {r['skipped']} |" + " |" * (len(head) - 3))
            continue
        cells = [r["model"], str(r["batch"]), f"{r['compile_ms']:.3f}", f"{r['build_ms']:.3f}",
                 f"{r['compile_over_build']:.2f}", *(f"{r[f'{p}_ms']:.3f}" for p in peers),
                 f"{r['compile_cosine']:.5f}", f"{r['build_cosine']:.5f}", f"{r['compile_s']:.1f}",
                 f"{r['export_s']:.1f}", f"{r['build_s']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    ap = harness.parser(__doc__, out="/tmp/compile-vs-build", out_help="folder for the JSON and markdown results")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/kiln-probe-cache"),
                    help="folder for the timing cache and the ONNX exports (reused between runs)")
    ap.add_argument("--budget-seconds", type=float, default=420.0, help="rows not started by then are skipped")
    ap.add_argument("--smoke", action="store_true", help="a tiny CNN and a tiny BERT at batch 1 and 2")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--peers", default=None,
                    help=f"comma-separated torch peers of {', '.join(PEERS)} [default: both; eager only on the CPU]")
    ap.add_argument("--iterations", type=int, default=None, help="timed calls per way [default: 50; 5 with --smoke]")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here; pass --device cpu (with --smoke for tiny shapes)")
    args.peers = [p for p in (args.peers or ("eager" if args.device == "cpu" else ",".join(PEERS))).split(",") if p]
    if any(p not in PEERS for p in args.peers):
        ap.error(f"--peers: choose from {', '.join(PEERS)}")
    args.iterations = args.iterations or (5 if args.smoke else 50)
    info = harness.banner(args.device)
    clock = harness.Budget(args.budget_seconds)
    cache = args.cache / ("smoke" if args.smoke else "full")
    cache.mkdir(parents=True, exist_ok=True)
    results = {"probe": "compile-vs-build", "precision": "fp16", "smoke": args.smoke, "peers": args.peers,
               "iterations": args.iterations, "budget_seconds": args.budget_seconds, "rows": []}
    for case in cases(args.smoke):
        for batch in ((1, 2) if args.smoke else (1, 64)):
            if clock.left <= 0:
                row = {"model": case.name, "batch": batch, "skipped": f"past --budget-seconds {args.budget_seconds:g}"}
            else:
                try:
                    row = run_case(case, batch, args, cache)
                except Exception as e:  # noqa: BLE001 - a row that fails is recorded with its reason, not fatal
                    row = {"model": case.name, "batch": batch,
                           "skipped": f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
            results["rows"].append(row)
            clock.log(str({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}))
    device = info["device"].lower().replace(" ", "-")
    results["device"], results["date"] = info["device"], info["date"]
    harness.write_json(args.out / f"compile-vs-build-{device}.json", results, device=args.device)
    md = args.out / f"compile-vs-build-{device}.md"
    md.write_text(render(results))
    print(f"wrote {md}", flush=True)
    return results


if __name__ == "__main__":
    main()
