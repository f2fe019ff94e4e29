"""Where a build's time goes: wall seconds per phase and counts of events, recorded by the object passed down.

Phases nest: `with phases.phase("precision"): ... with phases.phase("calibration"): ...` records each phase's own
(exclusive) time, so "precision" holds what its calibration did not take and the phases add up to at most the
wall time around them, never counting a second twice. perf_counter only: a few microseconds per phase.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator


@dataclass
class PhaseTimes:
    """Exclusive wall seconds per phase (in first-entered order), counts (candidates compiled, cache hits...) and
    busy seconds per worker kind (thread-seconds, e.g. each tactic's compile + check, summed over the threads)."""

    seconds: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    busy: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # `tally` runs on worker threads
    _inner: list[float] = field(default_factory=list, repr=False)  # per open phase, the seconds its inner ones took

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as `name`, less the time of the phases opened inside it."""
        self.seconds.setdefault(name, 0.0)
        self._inner.append(0.0)
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            inner = self._inner.pop()
            self.seconds[name] += max(0.0, elapsed - inner)
            if self._inner:
                self._inner[-1] += elapsed

    def split(self, name: str, part: str, seconds: float) -> None:
        """Move `seconds` of phase `name`'s time to phase `part` (time measured inside it by code that records no
        phases, e.g. the Engine setting itself up); never more than `name` holds."""
        moved = min(max(0.0, seconds), self.seconds.get(name, 0.0))
        self.seconds[name] = self.seconds.get(name, 0.0) - moved
        self.seconds[part] = self.seconds.get(part, 0.0) + moved

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def tally(self, name: str, seconds: float) -> None:
        """Add `seconds` of one thread's work to `name` (thread-safe): busy time, which may overlap other threads'."""
        with self._lock:
            self.busy[name] = self.busy.get(name, 0.0) + seconds

    def to_json(self) -> dict:
        """{"seconds": {phase: s}, "counts": {what: n}, "busy": {what: thread-seconds}}: plain JSON data, for the
        plan's build info."""
        return {"seconds": {k: round(v, 6) for k, v in self.seconds.items()}, "counts": dict(self.counts),
                "busy": {k: round(v, 6) for k, v in sorted(self.busy.items(), key=lambda kv: -kv[1])}}

