"""Building engines: device model, build context and the build pipeline."""

from kiln.builder.build import BuildContext, build
from kiln.builder.device import Device, detect

__all__ = ["BuildContext", "Device", "build", "detect"]
