"""The performance targets the headline is read against (issue 44), as data.

``bench.figures`` measures each target on the headline's group of runs and writes the verdict
into the generated block, so whether a target is met is computed from the results files,
never typed in. A target names a figure of ``bench.figures.FIGURES`` by its label and reads
either this project's value, its ratio to a peer (taken within each run), or its ratio to
another of its own figures (``over``: the same runs' value at another size).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    figure: str  # the label of a figure in bench.figures.FIGURES
    limit: float
    at_least: bool  # True: the measured median must be >= limit; False: <= limit
    peer: str | None = None  # read this project / peer instead of the value
    over: str | None = None  # read this project's figure / its own ``over`` figure
    why: str = ""  # what the target stands for, shown beside it

    @property
    def ratio(self) -> bool:
        return self.peer is not None or self.over is not None

    def wanted(self) -> str:
        limit = f"{self.limit:g}x" if self.ratio else f"{self.limit:g}"
        return (">= " if self.at_least else "<= ") + limit

    def met(self, median: float) -> bool:
        return median >= self.limit if self.at_least else median <= self.limit

    def label(self, unit: str) -> str:
        if self.peer:
            return f"{self.figure} vs {self.peer}"
        if self.over:
            return f"{self.figure} / {self.over}"
        return self.figure + (f" ({unit})" if unit else "")


SCALE_CONVERGE = "converge N=10,000"
TARGETS = [
    Target("converge", 1.3, True, peer="kopf"),
    Target("converge", 0.8, True, peer="cr-matched"),
    Target(SCALE_CONVERGE, 1.3, True, peer="kopf"),
    Target(SCALE_CONVERGE, 0.8, True, peer="cr-matched"),
    Target(SCALE_CONVERGE, 0.9, True, over="converge",
           why="throughput at 10,000 over 1,000: cost flat with N"),
    Target("CPU per converged object, whole footprint", 1.0, False, peer="kopf"),
    Target("100 updates/s: CPU per update, whole footprint", 1.5, False, peer="kopf"),
    Target("100 updates/s: event -> reconcile start p50", 5, False),
    Target("100 updates/s: event -> reconcile start p99", 30, False),
    Target("PSS after converging, operator processes", 150, False,
           why="the watcher and one worker"),
    Target("hot-standby takeover: reconciles it makes (nothing changed: 0 is right)", 0, False),
    Target("hot-standby takeover: resume", 1.0, False),
    Target("cold restart of the watcher alone: resume", 1.0, False),
]
