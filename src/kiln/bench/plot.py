"""`kiln bench --plot FILE.png`: latency histogram and per-layer time bars (matplotlib, the `plot` extra), written
to exactly the path named (format from its suffix, PNG without one) under kiln's write policy."""

from __future__ import annotations

import io
from pathlib import Path

from kiln.bench.profile import LayerProfile
from kiln.bench.result import BenchResult
from kiln.errors import ConfigError
from kiln.util import files

TOP_LAYERS = 20
KIND = files.Kind("Matplotlib image", "bench.png", lambda head: b"Matplotlib" in head)  # in its metadata


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib; install it with pip install 'kiln[plot]' (or pip install "
                          "matplotlib), or drop --plot") from None
    return plt


def check_plot(path: Path, force: bool = False) -> str:
    """The image format for `path` (its suffix, png without one), once matplotlib and the path are checked."""
    _pyplot()
    from matplotlib.backend_bases import FigureCanvasBase

    files.check(path, KIND, force=force, what="--plot image")
    fmt = path.suffix[1:].lower() or "png"
    supported = FigureCanvasBase.get_supported_filetypes()
    if fmt not in supported:
        raise ConfigError(f"--plot {path}: matplotlib cannot write .{fmt} images; use one of "
                          f"{', '.join('.' + f for f in sorted(supported))}, e.g. bench.png")
    return fmt


def plot_bench(result: BenchResult, profile: LayerProfile | None, path: Path, force: bool = False) -> None:
    """Write the figure to exactly `path` (format from its suffix, e.g. .png or .svg; PNG without one)."""
    fmt = check_plot(path, force)
    plt = _pyplot()
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
    image = io.BytesIO()
    try:
        fig.savefig(image, format=fmt)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--plot could not draw {path}: {e}") from None
    finally:
        plt.close(fig)
    files.write(path, image.getvalue(), KIND, force=force, what="--plot image")
