"""A layer's tactic choice: which tactic and config it runs with, how that was decided, what was rejected.

The autotuner (builder) makes Choices, plans record them (engine) and engines compile from them (runtime).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Choice:
    """The tactic a layer runs with, how it was chosen, and what was rejected and why."""

    tactic: str
    config: dict = field(default_factory=dict)
    microseconds: float | None = None
    source: str = "only"            # only | heuristic | timed | cache
    rejected: list[tuple[str, str]] = field(default_factory=list)
    timed: list[tuple[str, float]] = field(default_factory=list)  # every candidate timed: label, microseconds

    def to_json(self) -> dict:
        return {"tactic": self.tactic, "config": self.config, "microseconds": self.microseconds,
                "source": self.source, "rejected": [list(r) for r in self.rejected],
                "timed": [[label, round(us, 3)] for label, us in self.timed]}

    @classmethod
    def from_json(cls, d: dict) -> "Choice":
        return cls(str(d["tactic"]), dict(d.get("config") or {}), d.get("microseconds"), str(d.get("source", "")),
                   [(str(a), str(b)) for a, b in d.get("rejected") or []],
                   [(str(a), float(b)) for a, b in d.get("timed") or []])
