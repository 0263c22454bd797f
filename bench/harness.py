"""The harness: for each scenario, each repetition, each implementation in turn (the order
rotating between repetitions, so none always runs first or last), run it against the same
local control plane, check it, measure it, stop it. ``bench.results`` writes what it returns.

Implementation failures are recorded, not fatal: an implementation that fails the correctness
check (or crashes) gets no figure, and the others still run.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field

from . import config, report, workload
from .config import BenchConfig
from .impls import DEFAULT, build
from .impls.base import Impl
from .kube import Kube
from .scenarios import burst, converge, cost, latency, relist
from .scenarios.common import Harness

SCENARIOS = ["converge", "latency", "burst", "cost", "relist"]
# The implementations measured at every size (``Plan.sizes``): the headline's. The others run
# at the plan's N only, which keeps a full run within the hour.
SCALE_IMPLS = ("this-project", "kopf", "cr-matched")


@dataclass
class Plan:
    """What to run. ``quick()`` is the CI-sized plan; ``full()`` the documented one."""

    mode: str = "quick"
    n: int = 200
    reps: int = 1
    rates: list[int] = field(default_factory=lambda: [10, 100])
    window: float = 5.0
    burst_k: int = 100
    burst_spread: float = 1.0
    cost_sizes: list[int] = field(default_factory=lambda: [0, 200, 400])
    relist_n: int = 200
    # The converge sizes (the first is ``n``): the cost's slope over N and the steady updates
    # among N objects come from these. Only ``SCALE_IMPLS`` run the sizes above ``n``.
    sizes: list[int] = field(default_factory=lambda: [200, 400])
    steady_rate: int = 100  # updates/s among the converged objects after each converge
    scenarios: list[str] = field(default_factory=lambda: list(SCENARIOS))
    impls: list[str] = field(default_factory=lambda: list(DEFAULT))
    workers: int = 1
    concurrency: int = 8
    pool: str = "threads"
    beat: bool = False

    @classmethod
    def quick(cls, **kw) -> "Plan":
        n = kw.get("n", 200)
        base = dict(sizes=[n, 2 * n], cost_sizes=[0, n, 2 * n], relist_n=n)
        base.update(kw)
        return cls(**base)

    @classmethod
    def full(cls, large: bool = False, **kw) -> "Plan":
        n = kw.pop("n", 1000)
        sizes = sorted({n, 10_000, *([30_000] if large else [])})
        base = dict(mode="full-large" if large else "full", n=n, reps=3, window=15.0,
                    sizes=sizes, cost_sizes=[0, *sizes], relist_n=10_000 if large else n)
        base.update(kw)
        return cls(**base)

    def at(self, size: int, impl: Impl) -> bool:
        """Whether ``impl`` is measured at ``size`` (all at ``n``, the headline's at all)."""
        return size in (0, self.n) or impl.name in SCALE_IMPLS

    def as_dict(self) -> dict:
        return dict(vars(self))


def rotated(items: list, k: int) -> list:
    k %= max(1, len(items))
    return items[k:] + items[:k]


class Runner:
    def __init__(self, plan: Plan, cfg: BenchConfig | None = None, log=None):
        self.plan = plan
        self.cfg = cfg or config.load(own_postgres=True)
        self.log = log or (lambda *a: print(*a, flush=True))
        self.kube = Kube.from_config(self.cfg)
        self.h = Harness(self.cfg, self.kube, quick=plan.mode == "quick")
        self.impls: list[Impl] = build(self.cfg, plan.impls, plan.workers, plan.concurrency,
                                        plan.pool, plan.beat)

    def prepare(self) -> None:
        import fcntl

        from reconcilers.devstack import controlplane

        # One harness at a time per scratch dir: a second one would delete the first one's
        # namespaces, kill its processes and truncate its ledger.
        self._lock = open(self.cfg.work_dir / "harness.lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"another bench run is using {self.cfg.work_dir}; wait for it "
                             "(or give this one BENCH_WORK_DIR, BENCH_DATABASE_URL and "
                             "BENCH_REDIS_URL of its own)") from None

        if not controlplane.ready(self.cfg.stack):
            raise SystemExit("the local control plane is not up: run `make up` (or make bench)")
        if self.cfg.own_postgres is not None:
            t = time.monotonic()
            self.cfg.own_postgres.start()
            self._own_postgres_started = True
            self.log(f"the bench's durable PostgreSQL on port {self.cfg.own_postgres.port} "
                     f"ready ({time.monotonic() - t:.1f}s)")
        from .impls.base import kill_leftovers

        killed = kill_leftovers(self.cfg.work_dir / "procs.txt")
        if killed:
            self.log(f"killed {killed} process groups an interrupted bench run left running")
        workload.ensure_crd(self.kube)
        stale = workload.cleanup_stale(self.kube, self.h.owner)
        if stale:
            self.log(f"deleted {len(stale)} namespaces a previous bench run left behind")
        foreign = workload.foreign_items(self.kube)
        if foreign:
            where = ", ".join(f"{ns} ({n})" for ns, n in sorted(foreign.items()))
            raise SystemExit(f"{sum(foreign.values())} BenchItems are in namespaces no bench run "
                             f"made: {where}. Every implementation watches all namespaces, so "
                             "they would be reconciled inside the measurements; delete them "
                             "(kubectl delete namespace ...) and run again.")
        from .impls.controller_runtime import ensure_binaries

        t = time.monotonic()
        ensure_binaries()  # apiload is every scenario's loader, whichever implementations run
        self.log(f"Go peer and loader ready ({time.monotonic() - t:.1f}s)")
        for impl in self.impls:
            t = time.monotonic()
            impl.prepare()
            self.log(f"prepared {impl.name} ({time.monotonic() - t:.1f}s)")

    def operators(self, scenario: str) -> list[Impl]:
        return [i for i in self.impls if not getattr(i, "is_ceiling", False)
                and (i.only is None or scenario in i.only)]

    def _attempt(self, scenario: str, impl: Impl, fn, *args) -> dict:
        t = time.monotonic()
        version = impl.run_version()
        try:
            res = fn(*args)
        except Exception as exc:  # recorded: this implementation gets no figure for this run
            impl.stop()
            res = {"impl": impl.name, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()[-4000:]}
        res["seconds"] = round(time.monotonic() - t, 1)
        if version:
            res["version"] = version
        self.log(f"  {scenario:9} {impl.name:14} ok={res.get('ok')} "
                 f"{report.one_line(scenario, res)} ({res['seconds']}s)")
        return res

    def durability(self) -> dict:
        """The durability settings of the server under the bench database, from the server
        (the bench database's own: ``synchronous_commit`` can be set per database)."""
        from urllib.parse import urlsplit

        from . import postgres

        try:
            return postgres.durability(self.cfg.database_url)
        except Exception:  # no bench database (this project not among the implementations)
            url = urlsplit(self.cfg.database_url)
            return postgres.durability(url._replace(path="/postgres").geturl())

    def run(self) -> dict[str, list[dict]]:
        try:
            return self._run()
        finally:
            for impl in self.impls:  # interrupted: leave nothing running
                impl.stop()

    def close(self) -> None:
        """Stop the bench's PostgreSQL if this runner started (or adopted) it."""
        if getattr(self, "_own_postgres_started", False):
            self.cfg.own_postgres.stop()
            self._own_postgres_started = False

    def _run(self) -> dict[str, list[dict]]:
        p = self.plan
        results: dict[str, list[dict]] = {}
        for scenario in p.scenarios:
            runs: list[dict] = []
            for rep in range(p.reps):
                if scenario == "converge":
                    for size in p.sizes:
                        for impl in rotated([i for i in self.impls if p.at(size, i)
                                             and (i.only is None or scenario in i.only)], rep):
                            steady = None if getattr(impl, "is_ceiling", False) else (
                                p.steady_rate, p.window)
                            runs.append(self._attempt(scenario, impl, converge.run, self.h,
                                                      impl, size, rep, steady))
                    continue
                for impl in rotated(self.operators(scenario), rep):
                    if scenario == "latency":
                        runs.append(self._attempt(scenario, impl, latency.run, self.h, impl,
                                                  p.rates, p.window, rep))
                    elif scenario == "burst":
                        runs.append(self._attempt(scenario, impl, burst.run, self.h, impl,
                                                  p.burst_k, p.burst_spread, rep))
                    elif scenario == "relist":
                        runs.append(self._attempt(scenario, impl, relist.run, self.h, impl,
                                                  p.relist_n, rep))
                    elif scenario == "cost":
                        for n in [n for n in p.cost_sizes if p.at(n, impl)]:
                            reuse = next((r for r in results.get("converge", [])
                                          if r.get("impl") == impl.name and r.get("n") == n
                                          and r.get("rep") == rep and "operator_memory_after" in r),
                                         None)
                            runs.append(self._attempt(scenario, impl, cost.point, self.h, impl,
                                                      n, rep, reuse))
                if scenario == "relist":
                    self._paired_restart(runs, rep)
            results[scenario] = runs
        return results

    def _paired_restart(self, runs: list[dict], rep: int) -> None:
        """The relist's paired restart (``relist.run_paired``), recorded as the mode
        ``paired restart`` of each implementation's relist run of this repetition. Where one
        failed, neither gets the figure: the pair is the measurement."""
        pair = [i for i in self.operators("relist") if i.name in relist.PAIRED]
        if len(pair) != len(relist.PAIRED) or any(not i.supports_scope for i in pair):
            return
        t = time.monotonic()
        try:
            out = relist.run_paired(self.h, relist.alternate(pair, rep), self.plan.relist_n,
                                    rep)
        except Exception as exc:  # recorded in the log; the relist's own figures stand
            for impl in pair:
                impl.stop()
            self.log(f"  relist    paired restart failed: {type(exc).__name__}: {exc}")
            return
        ok = all(o["ok"] for o in out.values())
        for run in runs:
            if run.get("rep") == rep and run.get("impl") in out and ok and "modes" in run:
                run["modes"]["paired restart"] = out[run["impl"]]["mode"]
        self.log(f"  relist    paired restart ok={ok} " + "; ".join(
            f"{name} {o['mode']['resume_seconds']} s" for name, o in out.items())
            + f" ({time.monotonic() - t:.1f}s)")

    def describe(self) -> dict:
        return {impl.name: impl.describe() for impl in self.impls}
