"""Graph passes, one per file; `default_passes()` is the order the builder runs the float ones in (the full list,
with the precision passes gated on the build target, is quant/pipeline.py's)."""

from kiln.passes.manager import BuildTarget, PassContext, run_passes


def default_passes():
    """The optimization passes of a default build, in order."""
    from kiln.passes import registry

    return list(registry.DEFAULT)


__all__ = ["BuildTarget", "PassContext", "default_passes", "run_passes"]
