"""Probe (issue 23): a two-profile MiniLM engine against one-profile builds, and `kiln bench --streams 1/2/4`.

    PYTHONPATH=src:. python -m benchmarks.probes.gpu_profiles_streams --out /tmp/out.json
"""

from __future__ import annotations

from pathlib import Path

import kiln
from benchmarks.suite import CACHE
from benchmarks.models import SPECS, instantiate, onnx_file
from benchmarks.probes import harness
from kiln.bench.session import BenchOptions, run_bench

NAMES = ["input_ids", "attention_mask", "token_type_ids"]
SMALL, LARGE = ((1, 16), (2, 64), (4, 128)), ((8, 128), (16, 256), (32, 512))


def differing(both, profile: int, one) -> dict[str, list]:
    """The layers whose tactic under `both`'s `profile` differs from the one-profile engine's: name → [two, one]."""
    mine, theirs = both.profile_tactics[profile], one.profile_tactics[0]
    return {n: [c.to_json(), theirs[n].to_json()] for n, c in mine.items() if n in theirs and c != theirs[n]}


def main() -> None:
    args = harness.parser(__doc__, out="/tmp/gpu_profiles_streams.json").parse_args()
    clock = harness.Budget(540)
    harness.banner()
    spec = SPECS["minilm"]
    path, _ = onnx_file(spec, instantiate(spec, 128), 128, Path(CACHE), dynamic_seq=True)
    cache = str(Path(CACHE) / "timing-cache.sqlite")

    def build(*profiles):
        return kiln.build(str(path), kiln.BuildConfig(fp16=True, timing_cache=cache, profiles=tuple(
            {n: r for n in NAMES} for r in profiles)))

    both, small, large = build(SMALL, LARGE), build(SMALL), build(LARGE)
    clock.log("built the two-profile engine and one engine per profile")
    out = {"profiles": {"0": SMALL, "1": LARGE}, "rows": [],
           "tactics_differing": [differing(both, k, one) for k, one in enumerate((small, large))]}
    for b, s in [(1, 16), (2, 64), (3, 100), (4, 128), (8, 128), (16, 256), (32, 512)]:
        feeds = {k: v.cuda() for k, v in spec.inputs(b, s).items()}
        one = small if b <= 4 and s <= 128 else large
        c2, c1 = both.create_context(), one.create_context()
        rounds = [(harness.wall_ms(lambda: c2.run(feeds)), harness.wall_ms(lambda: c1.run(feeds))) for _ in range(3)]
        row = {"shape": f"{b}x{s}", "picked": both.select_profile({k: tuple(v.shape) for k, v in feeds.items()}),
               "two_profile_ms": min(r[0] for r in rounds), "one_profile_ms": min(r[1] for r in rounds),
               "rounds": rounds}
        row["ratio"] = row["two_profile_ms"] / row["one_profile_ms"]
        out["rows"].append(row)
        clock.log(str(row))
        harness.write_json(args.out, out)
    static = kiln.build(str(path), kiln.BuildConfig.with_shapes({n: (1, 128) for n in NAMES}, fp16=True,
                                                                timing_cache=cache))
    feeds = {k: v.numpy() for k, v in spec.inputs(1, 128).items()}
    out["streams"] = {}
    for n in (1, 2, 4):
        result = run_bench(static, feeds, BenchOptions(duration=3.0, streams=n))
        j = result.to_json()
        out["streams"][n] = {"queries_per_s": j["throughput"]["queries_per_s"], "latency_ms": j["latency_ms"]}
        clock.log(f"streams {n}: {j['throughput']['queries_per_s']:.0f} queries/s, latency {j['latency_ms']}")
    harness.write_json(args.out, out)


if __name__ == "__main__":
    main()
