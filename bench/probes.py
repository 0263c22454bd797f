"""What a run costs: CPU and memory of process groups, and the api-server's request counters.

CPU comes from ``/proc/<pid>/stat`` (utime+stime, plus cutime+cstime so children a process
already reaped still count) summed over each group's process tree, before and after. Groups:
the implementation's own processes, its whole footprint (its own processes plus every process
of the services it needs: for this project all of PostgreSQL and Redis), PostgreSQL (all of
it, and only the backends connected to the bench database), Redis, kube-apiserver, etcd,
kube-controller-manager and the harness. Memory: RSS from ``statm``, PSS from ``smaps_rollup``.
Shared services also serve whatever else runs on the machine: their figures carry that noise,
the bench-database backends do not. Writes are counted from the api-server's
``apiserver_request_total`` for BenchItems only, so other users of the stack do not count.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# The group of an implementation's whole footprint: its own processes and every process of the
# services it needs (``scenarios.common.footprint_roots``).
FOOTPRINT = "whole footprint"

TICK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm may contain spaces and parentheses: split after the last ')'.
    return raw[raw.rfind(")") + 2:].split()


def children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields:
                out.setdefault(int(fields[1]), []).append(int(entry))
    return out


def tree(roots: list[int], kids: dict[int, list[int]] | None = None) -> list[int]:
    """``roots`` and all their live descendants."""
    kids = kids if kids is not None else children_map()
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        if pid in out or not Path(f"/proc/{pid}").exists():
            continue
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def cpu_ticks(pid: int, with_children: bool = True) -> int:
    fields = _stat(pid)
    if not fields:
        return 0
    # fields[11..14] = utime stime cutime cstime (stat fields 14-17)
    total = int(fields[11]) + int(fields[12])
    if with_children:
        total += int(fields[13]) + int(fields[14])
    return total


def rss_kb(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KB
    except (OSError, IndexError, ValueError):
        return 0


def pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


@dataclass
class CpuSnapshot:
    """Per-pid CPU ticks of each group at one instant."""

    at: float
    groups: dict[str, dict[int, int]]


def cpu_snapshot(groups: dict[str, list[int]]) -> CpuSnapshot:
    """``groups`` maps a name to explicit pids (already expanded to trees by the caller)."""
    return CpuSnapshot(time.monotonic(),
                       {g: {pid: cpu_ticks(pid) for pid in pids} for g, pids in groups.items()})


def cpu_delta(before: CpuSnapshot, after: CpuSnapshot) -> dict[str, float]:
    """CPU seconds each group used between two snapshots (a pid new in ``after`` counts whole)."""
    out = {}
    for group, pids in after.groups.items():
        old = before.groups.get(group, {})
        ticks = sum(max(0, t - old.get(pid, 0)) for pid, t in pids.items())
        out[group] = round(ticks / TICK, 3)
    return out


class RssSampler(threading.Thread):
    """Samples the summed RSS of named process trees (the operator's, its whole footprint's);
    keeps each one's peak. One scan of ``/proc`` per sample serves every tree."""

    def __init__(self, trees: dict[str, Callable[[], list[int]]], interval: float = 0.25):
        super().__init__(daemon=True, name="rss-sampler")
        self.trees, self.interval = trees, interval
        self.peak_kb = {name: 0 for name in trees}
        self._stop_event = threading.Event()

    def sample(self) -> None:
        kids = children_map()
        for name, roots in self.trees.items():
            total = sum(rss_kb(p) for p in tree(roots(), kids))
            self.peak_kb[name] = max(self.peak_kb[name], total)

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


def established_ports(pids: list[int], port: int) -> list[int]:
    """Local ports of the established TCP connections these processes hold to ``port`` on the
    other end (the api-server's, PostgreSQL's), from ``/proc``."""
    inodes = set()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        try:
            for fd in os.listdir(fd_dir):
                try:
                    target = os.readlink(fd_dir / fd)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            local, remote, state, inode = f[1], f[2], f[3], f[9]
            if inode in inodes and state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:
                ports.append(int(local.rsplit(":", 1)[1], 16))
    return ports


def memory_of(roots: list[int]) -> dict:
    """Summed RSS and PSS of ``roots`` and their descendants. RSS counts a page shared by
    several processes (PostgreSQL's shared buffers, a prefork pool's inherited heap) once per
    process; PSS divides it among them, so PSS is what a group of processes really holds."""
    pids = tree(roots)
    return {"rss_kb": sum(rss_kb(p) for p in pids), "pss_kb": sum(pss_kb(p) for p in pids),
            "processes": len(pids)}


_METRIC = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.e+]+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')
WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION"}


def request_counts(metrics_text: str, group: str, resource: str) -> Counter:
    """``{(verb, subresource): count}`` of one resource from the api-server's /metrics."""
    out: Counter = Counter()
    for line in metrics_text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        m = _METRIC.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group("labels")))
        if labels.get("group") == group and labels.get("resource") == resource:
            out[(labels.get("verb", ""), labels.get("subresource", ""))] += int(float(m.group("value")))
    return out


@dataclass
class RequestDelta:
    counts: Counter = field(default_factory=Counter)

    @property
    def writes(self) -> int:
        return sum(v for (verb, _), v in self.counts.items() if verb in WRITE_VERBS)

    def as_dict(self) -> dict:
        return {f"{verb}{'/' + sub if sub else ''}": v for (verb, sub), v in sorted(self.counts.items())
                if v}


def request_delta(before: Counter, after: Counter) -> RequestDelta:
    delta = Counter({k: after[k] - before.get(k, 0) for k in after})
    return RequestDelta(+delta)
