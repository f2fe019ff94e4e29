"""Target facts: the device a build is for (its fingerprint) and the hardware-compatibility classes a plan targets.

The lowest layer above errors/version: everything from kernels up to the runtime reads device facts from here.
"""

from kiln.target.device import Device, detect
from kiln.target.hardware_compat import HardwareCompat

__all__ = ["Device", "HardwareCompat", "detect"]
