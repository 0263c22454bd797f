"""``BenchItem``: copy ``spec.value`` to ``status.value`` (with observedGeneration), nothing else.

The same reconcile every benchmarked implementation runs. Two bench-only knobs come from the
environment the harness sets: ``BENCH_TRACE_FILE`` (append one line per reconcile start, the
uniform way the harness counts runs and measures event-to-start latency for every peer) and
``BENCH_RECONCILE_SLEEP_MS`` (the burst scenario's 50 ms reconcile).
"""

from __future__ import annotations

import os
import time

from reconcilers.api import Reconciler, predicates, register

_TRACE = os.environ.get("BENCH_TRACE_FILE", "")
_SLEEP = float(os.environ.get("BENCH_RECONCILE_SLEEP_MS", "0") or 0) / 1000
_fd: dict[int, int] = {}  # pid -> trace fd: a prefork child must not share its parent's


def _trace(obj: dict) -> None:
    if not _TRACE:
        return
    pid = os.getpid()
    fd = _fd.get(pid)
    if fd is None:
        fd = _fd[pid] = os.open(_TRACE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    meta = obj["metadata"]
    # One write() of a short line on an O_APPEND file: lines from several processes never mix.
    os.write(fd, f"{time.time():.6f} {meta.get('namespace', '')}/{meta['name']} "
                 f"{meta.get('generation', 0)}\n".encode())


@register
class BenchItemReconciler(Reconciler):
    group = "bench.operator.local"
    version = "v1"
    kind = "BenchItem"
    # Like controller-runtime's GenerationChangedPredicate: our own status writes (and
    # annotation-only changes) do not trigger runs.
    predicates = [predicates.generation_changed]
    # No periodic resync during a benchmark (controller-runtime's SyncPeriod is 10 h, kopf has
    # none): every run measured is caused by the workload.
    resync_period = 0
    # 0 (the default) unless the harness runs the ``this-project-debounce`` variant.
    debounce = float(os.environ.get("BENCH_DEBOUNCE", "0") or 0)

    def reconcile(self, obj: dict, ctx):
        _trace(obj)
        if _SLEEP:
            time.sleep(_SLEEP)
        ctx.patch_status({"value": obj["spec"]["value"]})
