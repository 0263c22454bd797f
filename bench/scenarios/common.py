"""What every scenario does around its workload: a measured run of one implementation.

``measured_run`` gives a scenario fresh namespaces, the implementation started on a clean
state with a trace file, the observer watching, and a converged canary object - proof that the
whole pipeline (watch, queue, reconcile, status write) is live before anything is timed. It
stops everything and deletes the namespaces (with their objects) afterwards, so one run never
bleeds into the next. ``Meter`` takes the before/after snapshots of CPU, memory and api-server
writes, of the operator's own processes and of its whole footprint (``footprint_roots``).
"""

from __future__ import annotations

import os
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

from .. import probes, workload
from ..probes import FOOTPRINT
from ..config import BenchConfig
from ..impls.base import Impl
from ..kube import Kube
from ..observe import Observer


@dataclass
class Harness:
    """Shared by all scenarios of one harness run."""

    cfg: BenchConfig
    kube: Kube
    quick: bool
    loader_concurrency: int = 16

    @property
    def work(self) -> Path:
        return self.cfg.work_dir

    @property
    def owner(self) -> str:
        return workload.owner_of(self.cfg.work_dir)


@dataclass
class Run:
    h: Harness
    impl: Impl
    ns: workload.Namespaces
    trace: Path
    observer: Observer
    canary_value: int = 1

    def trace_lines(self, since: float = 0.0, obj: str | None = None) -> list[tuple[float, str, int]]:
        """Reconcile starts ``(t, "ns/name", generation)`` at or after ``since``."""
        out = []
        try:
            text = self.trace.read_text()
        except OSError:
            return out
        for line in text.splitlines():
            parts = line.split()
            if len(parts) != 3:
                continue
            t, o, g = float(parts[0]), parts[1], int(parts[2])
            if t >= since and (obj is None or o == obj) and o.split("/")[0] in self.ns.names:
                out.append((t, o, g))
        return out

    def bump_canary(self) -> tuple[float, int]:
        self.canary_value += 1
        return workload.update(self.h.kube, self.ns.names[0], workload.CANARY, self.canary_value)

    def wait_converged(self, obj: str, generation: int, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.observer.poll()
            t = self.observer.converged_at(obj, generation)
            if t is not None:
                return t
            self.impl.check_alive()
            time.sleep(0.02)
        return None

    def wait_quiet(self, since: float, quiet: float = 2.0, timeout: float = 120) -> None:
        """Until no reconcile started for ``quiet`` seconds (a run's tail of work is done)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.trace_lines(since)
            last = max((t for t, _, _ in lines), default=since)
            if time.time() - last >= quiet:
                return
            time.sleep(0.2)

    @property
    def canary(self) -> str:
        return f"{self.ns.names[0]}/{workload.CANARY}"


@contextmanager
def measured_run(h: Harness, impl: Impl, tag: str, namespaces: int = 1,
                 sleep_ms: int = 0, ready_timeout: float = 120,
                 scoped: bool = False) -> Iterator[Run]:
    """``scoped``: the implementation watches only this run's namespaces, so another can run
    beside it (the paired restart)."""
    ns = workload.Namespaces.create(h.kube, tag, namespaces, owner=h.owner)
    impl.scope = list(ns.names) if scoped else []
    trace = h.work / "traces" / f"{ns.run_id}-{impl.name}.trace"
    trace.parent.mkdir(parents=True, exist_ok=True)
    trace.write_text("")
    impl.log_dir = h.work / "logs" / f"{ns.run_id}-{impl.name}"
    observer = Observer(h.work / "traces" / f"{ns.run_id}-{impl.name}.observed")
    run = Run(h, impl, ns, trace, observer)
    try:
        impl.reset()
        observer.start()
        impl.start(trace, sleep_ms)
        workload.create(h.kube, ns.names[0], workload.CANARY, run.canary_value)
        if run.wait_converged(run.canary, 1, ready_timeout) is None:
            raise TimeoutError(f"{impl.name}: the canary did not converge in {ready_timeout}s; "
                               f"logs in {impl.logs()}")
        yield run
    finally:
        # Each step runs even if another fails: a stopped observer must never leave the
        # implementation running or the namespaces behind.
        for step in (observer.stop, impl.stop, partial(setattr, impl, "scope", []),
                     lambda: ns.delete(h.kube)):
            try:
                step()
            except Exception as exc:  # reported, the original error (if any) propagates
                print(f"cleanup of {ns.run_id}: {type(exc).__name__}: {exc}", flush=True)


def bench_backends(cfg: BenchConfig) -> list[int]:
    """PostgreSQL backends connected to the bench database (only this project has any)."""
    import psycopg

    url = urlsplit(cfg.database_url)
    name = url.path.lstrip("/")
    try:
        with psycopg.connect(url._replace(path="/postgres").geturl(), autocommit=True) as conn:
            rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s",
                                [name]).fetchall()
        return [r[0] for r in rows]
    except Exception:
        return []


def footprint_roots(h: Harness, impl: Impl) -> list[int]:
    """The roots of ``impl``'s whole footprint: its own processes and every process of each
    service it needs (this project: all of PostgreSQL and Redis, not only its connections to
    them - what a user runs for it). A peer's footprint is its own processes."""
    stack = h.cfg.stack_pids()
    return impl.roots() + [stack[s] for s in impl.services if s in stack]


def process_groups(h: Harness, impl: Impl) -> dict[str, list[int]]:
    kids = probes.children_map()
    stack = h.cfg.stack_pids()
    groups = {"operator": probes.tree(impl.roots(), kids),
              FOOTPRINT: probes.tree(footprint_roots(h, impl), kids)}
    operator = set(groups["operator"])
    groups["postgres (bench db backends)"] = bench_backends(h.cfg)
    for service in ("postgres", "redis", "kube-apiserver", "etcd", "kube-controller-manager"):
        if service in stack:
            groups[service if service != "postgres" else "postgres (all)"] = probes.tree(
                [stack[service]], kids)
    # The implementation's processes are the harness's children too: count them once.
    groups["harness (loader, observer)"] = [p for p in probes.tree([os.getpid()], kids)
                                            if p not in operator]
    return groups


@dataclass
class Meter:
    """CPU, api-server writes and (optionally) peak RSS between ``start()`` and ``stop()``, of
    the operator's processes and of its whole footprint; RSS and PSS of both at ``stop()``."""

    h: Harness
    impl: Impl
    sample_rss: bool = True
    cpu_before: probes.CpuSnapshot | None = None
    requests_before: object = None
    sampler: probes.RssSampler | None = None
    redis_before: int = 0
    result: dict = field(default_factory=dict)

    def _requests(self):
        return probes.request_counts(self.h.kube.text("/metrics"), workload.GROUP, workload.PLURAL)

    def _redis_memory(self) -> int:
        """Bytes held by this project's shared cache (``operator:obj:*`` hashes) in the bench
        Redis db: exact and attributable, unlike the instance-wide ``used_memory``."""
        import redis

        r = redis.Redis.from_url(self.h.cfg.redis_url)
        try:
            return sum(int(r.memory_usage(k, samples=0) or 0)
                       for k in r.scan_iter(match="operator:obj:*", count=1000))
        finally:
            r.close()

    def start(self) -> "Meter":
        self.requests_before = self._requests()
        self.redis_before = self._redis_memory()
        if self.sample_rss:
            self.sampler = probes.RssSampler(
                {"operator": self.impl.roots,
                 FOOTPRINT: lambda: footprint_roots(self.h, self.impl)})
            self.sampler.sample()
            self.sampler.start()
        self.cpu_before = probes.cpu_snapshot(process_groups(self.h, self.impl))
        return self

    def stop(self) -> dict:
        after = probes.cpu_snapshot(process_groups(self.h, self.impl))
        requests = probes.request_delta(self.requests_before, self._requests())
        out = {"cpu_seconds": probes.cpu_delta(self.cpu_before, after),
               "wall_seconds": round(after.at - self.cpu_before.at, 3),
               "api_requests": requests.as_dict(), "api_writes": requests.writes,
               "redis_cache_delta_bytes": self._redis_memory() - self.redis_before}
        if self.sampler is not None:
            self.sampler.sample()
            self.sampler.stop()
            out["operator_rss_peak_kb"] = self.sampler.peak_kb["operator"]
            out["footprint_rss_peak_kb"] = self.sampler.peak_kb[FOOTPRINT]
        out["operator_memory_after"] = probes.memory_of(self.impl.roots())
        out["footprint_memory_after"] = probes.memory_of(footprint_roots(self.h, self.impl))
        self.result = out
        return out


def new_id() -> str:
    return uuid.uuid4().hex[:8]
