"""The pass manager: runs graph passes to a fixpoint and names the pass in any error."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from kiln.errors import InternalError, KilnError
from kiln.ir import Network

Pass = Callable[[Network, "PassContext"], bool]

MAX_ROUNDS = 50


@dataclass
class PassContext:
    """What passes may read besides the network: budgets and a log of what each pass did."""

    fold_budget_bytes: int = 64 * 2**20
    log: dict[str, int] = field(default_factory=dict)

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
                    net.verify()
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
