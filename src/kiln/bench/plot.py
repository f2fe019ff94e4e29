"""`kiln bench --plot FILE.png`: latency histogram and per-layer time bars (matplotlib, the `plot` extra)."""

from __future__ import annotations

from pathlib import Path

from kiln.bench.profile import LayerProfile
from kiln.bench.result import BenchResult
from kiln.errors import ConfigError

TOP_LAYERS = 20


def plot_bench(result: BenchResult, profile: LayerProfile | None, path: Path) -> None:
    """Write the figure to `path` (format from its suffix, e.g. .png or .svg)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib; install it with pip install 'kiln[plot]' (or pip install "
                          "matplotlib), or drop --plot") from None
    panels = 2 if profile is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 4.5), squeeze=False)
    ax = axes[0][0]
    ax.hist(result.series("host"), bins=40, alpha=0.7, label="host latency")
    if (gpu := result.series("compute")) and result.is_cuda:
        ax.hist(gpu, bins=40, alpha=0.7, label="GPU compute")
    ax.set(xlabel="ms per query", ylabel="queries", title=f"{result.count} queries on {result.device}, "
                                                           f"batch {result.batch}, {result.streams} stream(s)")
    ax.legend()
    if profile is not None:
        ranked = profile.ranked()[:TOP_LAYERS][::-1]
        bars = axes[0][1]
        bars.barh([f"{t.name} ({t.kind})" for t in ranked], [t.mean for t in ranked])
        bars.set(xlabel="mean ms", title=f"slowest {len(ranked)} layers ({profile.iterations} profiled passes)")
        bars.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    try:
        fig.savefig(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--plot could not write {path}: {e}") from None
    finally:
        plt.close(fig)
