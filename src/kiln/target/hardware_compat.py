"""Hardware-compatibility classes a build can target, and what each keeps out of the tactic search.

`none` tunes for this card alone; `same-cc` keeps only tactics valid on every GPU of this compute
capability (nothing sized by this card's SM count or L2); `portable` keeps only tactics valid on every
GPU from sm80 on (Triton configs within 48 KiB of shared memory, no architecture-specific instructions).
Triton kernels are compiled on the device a plan is loaded on, so only their configs need to fit.
"""

from __future__ import annotations

import enum

from kiln.errors import ConfigError

PORTABLE_SMEM = 48 * 1024       # shared memory every CUDA GPU gives a block without opting in
PORTABLE_MIN_CC = (8, 0)        # the oldest architecture a portable plan promises to run on


class HardwareCompat(enum.Enum):
    NONE = "none"
    SAME_CC = "same-cc"
    PORTABLE = "portable"

    @classmethod
    def parse(cls, value) -> "HardwareCompat":
        try:
            return value if isinstance(value, cls) else cls(str(value))
        except ValueError:
            raise ConfigError(f"hardware compatibility {value!r} is not one of "
                              f"{', '.join(c.value for c in cls)}") from None

    def describe(self) -> str:
        """One line for the build summary: what the plan may run on and what it gave up."""
        return {
            HardwareCompat.NONE: "hardware-compat none: tuned for this GPU model only; loading it on another "
                                 "GPU model needs --policy warn or retune",
            HardwareCompat.SAME_CC: "hardware-compat same-cc: tactics valid on any GPU of this compute capability "
                                    "(none sized by this card's SM count or L2); loads under strict on such GPUs",
            HardwareCompat.PORTABLE: "hardware-compat portable: tactics valid on every GPU from sm80 on (Triton "
                                     "configs within 48 KiB shared memory, no architecture-specific instructions); "
                                     "loads under strict on any such GPU",
        }[self]


def of(device) -> HardwareCompat:
    return HardwareCompat.parse(getattr(device, "hardware_compat", "none") or "none")


def tactic_reason(tactic, device) -> str | None:
    """Why `tactic` is kept out of a build for `device`'s compatibility class, or None."""
    compat = of(device)
    if compat is HardwareCompat.PORTABLE and tactic.arch_specific:
        return "hardware-compat portable: uses instructions of one GPU architecture"
    if compat is not HardwareCompat.NONE and tactic.card_specific:
        return f"hardware-compat {compat.value}: its configurations are sized by this card (SM count, L2)"
    return None


def smem_budget(device, native: int) -> int:
    """Shared memory a kernel config may use: the card's own limit, or 48 KiB for portable builds."""
    return min(native, PORTABLE_SMEM) if of(device) is HardwareCompat.PORTABLE else native
