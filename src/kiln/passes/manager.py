"""The pass manager: runs graph passes to a fixpoint and names the pass in any error."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from kiln.errors import InternalError, KilnError
from kiln.ir import Network
from kiln.kinds.verify import verify_network

Pass = Callable[[Network, "PassContext"], bool]

MAX_ROUNDS = 50


def _no_shape_fits(k: int, n: int, n2: int, residual: bool, kx: int = 0) -> bool:
    return False


@dataclass(frozen=True)
class BuildTarget:
    """What a build is for, as far as the passes gated on it (passes/registry.py's `Step.when`) and the passes
    themselves need to know. The builder fills it from the config and the device; the default is a float build
    with no device-specific kernels, which is what `kiln inspect` and the float passes assume."""

    quantized: bool = False  # --int8 or --fp8: the precision stage has made quantized layers
    int8_conv_kernels: bool = False  # the device runs the Gluon int8 1x1 conv pair and chain kernels (Hopper)
    # which (K, N, N2, residual, K of a pair's second conv or 0) 1x1 conv chains the chain kernel runs well there
    int8_chain_fits: Callable[[int, int, int, bool, int], bool] = _no_shape_fits


@dataclass
class PassContext:
    """What passes may read besides the network: budgets, the build target, and a log of what each pass did."""

    fold_budget_bytes: int = 64 * 2**20
    log: dict[str, int] = field(default_factory=dict)
    target: BuildTarget = field(default_factory=BuildTarget)

    def record(self, pass_name: str, count: int = 1) -> None:
        self.log[pass_name] = self.log.get(pass_name, 0) + count


def run_passes(net: Network, passes: list[Pass], ctx: PassContext, verify: bool = True) -> Network:
    """Apply `passes` in order, repeatedly, until none changes the network."""
    for _ in range(MAX_ROUNDS):
        changed = False
        for p in passes:
            name = getattr(p, "__name__", repr(p))
            try:
                did = p(net, ctx)
                if verify:
                    verify_network(net)
            except KilnError:
                raise
            except InternalError as e:
                raise InternalError(f"pass {name} broke the network: {e}") from e
            except Exception as e:
                raise InternalError(f"pass {name} failed: {type(e).__name__}: {e}") from e
            if did:
                ctx.record(name)
            changed |= bool(did)
        if not changed:
            return net
    raise InternalError(f"passes did not reach a fixpoint in {MAX_ROUNDS} rounds: {[p.__name__ for p in passes]}")
