"""``python -m bench [--quick] [--large] ...``: run the benchmarks, keep the results, update the
figures (``bench.figures``) in docs/contributing/benchmarks.md.

    make bench-quick   # N=200, 1 repetition, 5 s latency windows: a few minutes
    make bench         # N=1,000 and 10,000, 3 repetitions alternating implementations
    python -m bench --large            # also N=30,000, and the relist at N=10,000
    python -m bench --quick --scenarios converge --impls this-project,cr-matched
    python -m bench.figures            # the headline again, from every results file
"""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
import signal
import sys
import time
from pathlib import Path

from . import config, figures, postgres, report, results
from .harness import SCENARIOS, Plan, Runner
from .impls import DEFAULT


def _interrupt(*_) -> None:
    """SIGTERM (a CI timeout) unwinds like Ctrl-C, so the runner stops what it started."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the CI-sized run")
    parser.add_argument("--large", action="store_true",
                        help="full run with N=30,000 too, and the relist at N=10,000")
    parser.add_argument("--n", type=int, help="objects in the converge scenario")
    parser.add_argument("--reps", type=int, help="repetitions (default 1 quick, 3 full)")
    parser.add_argument("--window", type=float, help="seconds of each latency window")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--impls", default=",".join(DEFAULT))
    parser.add_argument("--workers", type=int, default=1, help="this project: worker processes")
    parser.add_argument("--pool", choices=["threads", "prefork"], default="threads",
                        help="this project: the workers' pool (threads: the default layout)")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="this project: threads (or prefork children) per worker")
    parser.add_argument("--beat", action="store_true",
                        help="this project: a separate celery beat instead of the watcher "
                             "sending the periodic tasks (the large-install layout)")
    parser.add_argument("--no-doc", action="store_true",
                        help="do not update docs/contributing/benchmarks.md")
    parser.add_argument("--out", default=str(config.BENCH / "results"),
                        help="where the result files go (experiments: somewhere scratch)")
    args = parser.parse_args(argv)

    kw = {"scenarios": [s for s in args.scenarios.split(",") if s],
          "impls": [i for i in args.impls.split(",") if i],
          "workers": args.workers, "concurrency": args.concurrency, "pool": args.pool,
          "beat": args.beat}
    unknown = set(kw["scenarios"]) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; known: {SCENARIOS}")
    if args.n:
        kw["n"] = args.n
    if args.reps:
        kw["reps"] = args.reps
    if args.window:
        kw["window"] = args.window
    if args.quick:
        plan = Plan.quick(**kw)
    else:
        plan = Plan.full(large=args.large, **kw)

    signal.signal(signal.SIGTERM, _interrupt)
    command = " ".join(["python -m bench", *(shlex.quote(a) for a in argv)])
    started = dt.datetime.now(dt.timezone.utc)
    # What the figures depend on, taken before the run: the tree can move during a long one
    # (each implementation's run records the commit it started from too).
    provenance = {"run_id": results.run_id(started), "project": results.project(),
                  "arguments": argv, "environment": results.overrides()}
    t0 = time.monotonic()
    runner = Runner(plan)
    print(f"bench: mode {plan.mode}, N={plan.n}, reps={plan.reps}, scenarios {plan.scenarios}, "
          f"implementations {plan.impls}; scratch in {runner.cfg.work_dir}", flush=True)
    try:
        runner.prepare()
        # Read from the server, before anything is measured: what the ledger paid for.
        durability = runner.durability()
        shown = ", ".join(f"{k} {durability[k]}" for k in postgres.DURABILITY_SETTINGS)
        print(f"bench: PostgreSQL on port {durability['port']}: {shown}", flush=True)
        measured = runner.run()
    finally:
        runner.close()
    meta = {"command": command, "started_at": started.strftime("%Y-%m-%d %H:%M UTC"),
            **provenance, "elapsed_seconds": time.monotonic() - t0, "plan": plan.as_dict(),
            "machine": config.machine(), "implementations": runner.describe(),
            "durability": durability,
            "stack": {"kubernetes": "v1.35.4", "etcd": "v3.6.16",
                      "bench_database": runner.cfg.database_url.rsplit("/", 1)[-1],
                      "bench_redis": runner.cfg.redis_url}}
    for path in results.write(measured, meta, Path(args.out)):
        print(f"wrote {path}")
    body = report.markdown(measured, meta)
    if not args.no_doc:
        doc = config.REPO / "docs" / "contributing" / "benchmarks.md"
        report.update_doc(doc, {"full": "full", "large": "large"}.get(
            results.mode_of(plan.mode), "quick"), body)
        print(f"updated {doc.relative_to(config.REPO)}")
    print(body)
    if not args.no_doc:
        # The headline: medians over every full run of one version, from all results files.
        figures.main([])
    print(f"bench: done in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
