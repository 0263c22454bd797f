"""The kopf peer of the benchmark: the BenchItem reconcile as a kopf create/update handler.

Run by bench/impls/kopf_impl.py as ``kopf run --standalone --all-namespaces --quiet``. The only
setting changed from kopf's defaults is ``posting.enabled = False`` (no Kubernetes Events for
handler outcomes: the other implementations post none). Every other setting stays kopf's
default and is written to ``BENCH_SETTINGS_OUT`` at start-up for the record.
"""

import asyncio
import dataclasses
import json
import os
import time

import kopf

TRACE = os.environ.get("BENCH_TRACE_FILE", "")
SLEEP = float(os.environ.get("BENCH_RECONCILE_SLEEP_MS", "0") or 0) / 1000
_fd = os.open(TRACE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if TRACE else None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    settings.posting.enabled = False
    out = os.environ.get("BENCH_SETTINGS_OUT")
    if out:
        record = {}
        for f in dataclasses.fields(settings):
            group = getattr(settings, f.name)
            record[f.name] = {
                k: (v if isinstance(v, (int, float, str, bool, type(None), list, tuple))
                    else type(v).__name__)
                for k, v in vars(group).items()}
        with open(out, "w") as fh:
            json.dump(record, fh, indent=1, default=str)


@kopf.on.create("bench.operator.local", "v1", "benchitems")
@kopf.on.update("bench.operator.local", "v1", "benchitems", field="spec")
async def reconcile(spec, meta, patch, namespace, name, **_):
    if _fd is not None:
        os.write(_fd, f"{time.time():.6f} {namespace}/{name} {meta.get('generation', 0)}\n".encode())
    if SLEEP:
        await asyncio.sleep(SLEEP)
    patch.status["value"] = spec.get("value")
    patch.status["observedGeneration"] = meta.get("generation")
