"""Graph passes, one per file; `default_passes()` is the order the builder runs them in."""

from kiln.passes.manager import PassContext, run_passes


def default_passes():
    """The optimization passes of a default build, in order."""
    from kiln.passes import registry

    return list(registry.DEFAULT)


__all__ = ["PassContext", "default_passes", "run_passes"]
