"""The implementations the harness can run, by name.

``this-project``, ``this-project-debounce`` (the same with ``Reconciler.debounce = 0.5``, in
the burst scenario only), ``kopf``, ``cr-default`` (controller-runtime as shipped),
``cr-matched`` (``MaxConcurrentReconciles`` equal to this project's run threads: workers x
concurrency), ``cr-qps1000`` (client rate limit raised to QPS 1000 / burst 2000) and
``ceiling-c<N>`` (no operator: plain client writes from N goroutines).
"""

from __future__ import annotations

from ..config import BenchConfig
from .base import Impl
from .ceiling import Ceiling
from .controller_runtime import ControllerRuntime
from .kopf_impl import Kopf
from .this_project import ThisProject

DEFAULT = ["this-project", "this-project-debounce", "kopf", "cr-default", "cr-matched",
           "cr-qps1000", "ceiling-c1", "ceiling-c4", "ceiling-c16"]


def build(cfg: BenchConfig, names: list[str], workers: int = 1, concurrency: int = 8,
          pool: str = "threads", beat: bool = False) -> list[Impl]:
    out: list[Impl] = []
    layout = {"workers": workers, "concurrency": concurrency, "pool": pool, "beat": beat}
    for name in names:
        if name == "this-project":
            out.append(ThisProject(cfg, **layout))
        elif name == "this-project-debounce":
            out.append(ThisProject(cfg, name=name, debounce=0.5, only=("burst",), **layout))
        elif name == "kopf":
            out.append(Kopf(cfg))
        elif name == "cr-default":
            out.append(ControllerRuntime(cfg))
        elif name == "cr-matched":
            # The same concurrency as this project's runs: one run per thread (or prefork
            # child) of every worker.
            out.append(ControllerRuntime(cfg, name="cr-matched",
                                         max_concurrent_reconciles=workers * concurrency))
        elif name == "cr-qps1000":
            out.append(ControllerRuntime(cfg, name="cr-qps1000", qps=1000, burst=2000))
        elif name.startswith("ceiling-c") and name[9:].isdigit():
            out.append(Ceiling(cfg, name=name, concurrency=int(name[9:])))
        else:
            raise ValueError(f"unknown implementation {name!r}; known: {DEFAULT}")
    return out
