"""``python -m bench.profile [--n 400] [--steady RATE]``: where this project's CPU goes during a
converge, or (``--steady``) during updates at RATE/s of the latency scenario's converged pool.

Starts this project as the benchmark does, attaches py-spy (pinned, installed from PyPI into a
cached venv) to the watcher, the Celery worker and each pool child, converges N objects, and
prints CPU per object per process and the share of samples spent in each engine stage. Used to
find what dominates when a target is missed (bench/results/history.md, "What dominates").
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from . import config, probes
from .config import cache_root
from .impls import build
from .impls.ceiling import apiload
from .kube import Kube
from .scenarios import latency
from .scenarios.common import Harness, measured_run
from .workload import ensure_crd

PY_SPY = "py-spy==0.4.3"

# Substrings of py-spy frames ("function (file:line)") -> the stage they belong to.
STAGES = [
    ("new PostgreSQL connection", "get_new_connection"),
    ("ledger.claim", "claim (reconcilers/_queue/ledger.py"),
    ("read object from cache", "read_object (reconcilers/_run/call.py"),
    ("reconcile (user code + status PATCH)", "invoke (reconcilers/_run/call.py"),
    ("  of which: api-server request", "request (reconcilers/_kube/kube.py"),
    ("history row + ledger.finish (one statement)", "_finish (reconcilers/_run/runner.py"),
    ("  of which: the history row's values", "new_values (reconcilers/_run/history.py"),
    ("workqueue.send (publish after commit)", "send (reconcilers/_queue/workqueue.py"),
    ("celery: ack (kombu redis QoS)", "Message.ack"),
    ("celery: receive (BRPOP)", "_brpop_read"),
    ("watcher: event handling + cache write", "handle (reconcilers/_watch/reflector.py"),
    ("watcher: enqueue statement", "enqueue (reconcilers/_queue/ledger.py"),
    ("watcher: publish messages", "(reconcilers/_queue/broker.py"),
]


# Where a process's samples go, each sample counted once: the first group whose needle is in
# its stack (so the engine's stages before the libraries they call; Celery and kombu last,
# which leaves them the consumer's receive, acknowledgement and task trace).
GROUPS = [
    ("ledger: claim (SQL)", ("claim (reconcilers/_queue/ledger.py",)),
    ("ledger: finish + history row (SQL)", ("finish (reconcilers/_queue/ledger.py",
                                            "_finish (reconcilers/_run/runner.py")),
    ("shared cache read (Redis)", ("read_object (reconcilers/_run/call.py",)),
    ("reconcile: user code + status PATCH (HTTP)", ("invoke (reconcilers/_run/call.py",)),
    ("watcher: watch stream read + JSON", ("watch_events (reconcilers/_kube/kube.py",)),
    ("watcher: event handling + fenced cache write", ("handle (reconcilers/_watch/reflector.py",)),
    ("watcher: enqueue statement (SQL)", ("enqueue (reconcilers/_queue/ledger.py",)),
    ("watcher: publish (Celery send_task)", ("send (reconcilers/_queue/workqueue.py",)),
    ("watcher: journal clear (Redis)", ("_clear (reconcilers/_watch/enqueuer.py",)),
    ("Celery/kombu: receive, unacked bookkeeping, ack, task trace", ("kombu/", "celery/")),
]


def _samples(raw: Path) -> Iterator[tuple[str, int]]:
    """``(stack, count)`` per line of a raw py-spy file."""
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            yield stack, int(count)


def exclusive(raw: Path) -> tuple[int, collections.Counter]:
    """``(samples, {group: samples})`` of one process's raw py-spy file (``GROUPS``; the rest
    is ``other``)."""
    total, out = 0, collections.Counter()
    for stack, count in _samples(raw):
        total += count
        label = next((label for label, needles in GROUPS if any(n in stack for n in needles)),
                     "other")
        out[label] += count
    return total, out


def ensure_py_spy() -> Path:
    venv = cache_root() / f"py-spy-{PY_SPY.split('==')[1]}"
    exe = venv / "bin" / "py-spy"
    if not exe.exists():
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", PY_SPY], check=True)
    return exe


def stages(raw: Path) -> tuple[int, collections.Counter]:
    total, out = 0, collections.Counter()
    for stack, count in _samples(raw):
        total += count
        for label, needle in STAGES:
            if needle in stack:
                out[label] += count
    return total, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--out", default=None, help="directory for the raw py-spy files")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--steady", type=int, default=0, metavar="RATE",
                        help="profile RATE updates/s for 15 s over a converged pool of 100 "
                             "(the latency scenario's load) instead of a converge of N")
    parser.add_argument("--gil", action="store_true",
                        help="sample only threads holding the GIL: CPU in Python, not waits "
                             "(what matters for a thread-pool worker)")
    args = parser.parse_args(argv)
    spy = ensure_py_spy()
    cfg = config.load()
    out = Path(args.out or cfg.work_dir / "profile")
    out.mkdir(parents=True, exist_ok=True)
    kube = Kube.from_config(cfg)
    ensure_crd(kube)  # a fresh stack has not had the benchmark's CRD yet
    h = Harness(cfg, kube, quick=True)
    impl, loader = build(cfg, ["this-project", "cr-default"])
    impl.prepare()
    loader.prepare()  # builds the Go loader (apiload) on a fresh cache
    with measured_run(h, impl, "pf") as r:
        pool = []
        if args.steady:
            ns = r.ns.names[0]
            apiload(cfg, "create", latency.POOL, [ns], 8, 0, prefix="pool")
            pool = [(ns, f"pool-{i}") for i in range(latency.POOL)]
            if not r.observer.wait(lambda o: all(o.converged_at(f"{ns}/{x}", 1) for _, x in pool),
                                   120):
                raise TimeoutError("the pool did not converge")
        time.sleep(2)
        pids = probes.tree(impl.roots())
        names = {p: Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ")[:70] for p in pids}
        spies = [subprocess.Popen([str(spy), "record", "-p", str(p), "-r", str(args.rate), "-f", "raw",
                                   "-o", str(out / f"{p}.txt"), "--nonblocking",
                                   *(["--gil"] if args.gil else [])],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for p in pids]
        time.sleep(1)
        before = probes.cpu_snapshot({str(p): [p] for p in pids})
        t0 = time.time()
        if args.steady:
            work = args.steady * 15
            stats = latency.window_of(h, r, pool, args.steady, 15.0, 1_000_000)
            if not stats["complete"]:
                raise TimeoutError("the steady updates did not converge")
        else:
            work = args.n
            apiload(cfg, "create", args.n, r.ns.names, 16, 7)
            keys = [f"{r.ns.of(i)}/item-{i}" for i in range(args.n)]
            r.observer.wait(lambda o: all(o.converged_at(k, 1) for k in keys), 300)
        elapsed = time.time() - t0
        cpu = probes.cpu_delta(before, probes.cpu_snapshot({str(p): [p] for p in pids}))
        for s in spies:
            s.send_signal(2)
        for s in spies:
            s.wait(30)
    unit = "update" if args.steady else "object"
    print(f"{work} {unit}s in {elapsed:.1f}s ({work / elapsed:.1f}/s)")
    print(f"CPU ms per {unit} by process:")
    for p in pids:
        print(f"  {cpu[str(p)] * 1000 / work:7.2f}  {p} {names[p]}")
    total_samples, by_stage = 0, collections.Counter()
    for p in pids:
        raw = out / f"{p}.txt"
        if raw.exists() and ("worker" in names[p] or "watch" in names[p]):
            t, s = stages(raw)
            total_samples += t
            by_stage.update(s)
    print(f"share of py-spy samples in watcher + worker processes ({total_samples}):")
    for label, _ in STAGES:
        print(f"  {100 * by_stage[label] / max(1, total_samples):5.1f}%  {label}")
    for p in pids:
        raw = out / f"{p}.txt"
        if raw.exists() and ("worker" in names[p] or "watch" in names[p]):
            t, groups = exclusive(raw)
            per_unit = cpu[str(p)] * 1000 / work
            print(f"{names[p][:60]}: {per_unit:.2f} ms per {unit}, each sample counted once:")
            for label, count in groups.most_common():
                print(f"  {100 * count / max(1, t):5.1f}%  {per_unit * count / max(1, t):5.2f} ms  "
                      f"{label}")
    print(f"raw profiles (py-spy 'raw' format, for flamegraph.pl) in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
