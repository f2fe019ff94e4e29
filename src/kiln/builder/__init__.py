"""Building engines: the build context and the build pipeline (device facts live in kiln.target)."""

from kiln.builder.build import BuildContext, build

__all__ = ["BuildContext", "build"]
