"""controller-runtime: a small Go operator (``bench/peers/controller-runtime``), and its sibling
``apiload`` (the loader and the api-server ceiling), built from the Go module proxy.

The binaries are built with the toolchain ``reconcilers/devstack/ensure-go.sh`` finds or installs and cached
under ``<cache>/bench/controller-runtime-<hash of the module's sources>/``: changing a source
file rebuilds, anything else reuses. Three variants run: controller-runtime's defaults
(``cr-default``: ``MaxConcurrentReconciles`` 1, and in v0.23 no client-side rate limiter, QPS -1,
relying on API Priority and Fairness), ``cr-matched`` (``MaxConcurrentReconciles`` equal to this
project's run threads, so both get the same concurrency) and an explicit QPS 1000 / burst 2000.
Every other setting is controller-runtime's default.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..config import BENCH, REPO, cache_root
from .base import Impl

MODULE = BENCH / "peers" / "controller-runtime"
OPERATOR, APILOAD = "bench-cr-operator", "apiload"


def _sources() -> list[Path]:
    files = [MODULE / "go.mod", MODULE / "go.sum"]
    files += sorted(p for p in MODULE.rglob("*.go"))
    return files


def source_hash() -> str:
    h = hashlib.sha256()
    for f in _sources():
        h.update(str(f.relative_to(MODULE)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def bin_dir() -> Path:
    return cache_root() / f"controller-runtime-{source_hash()}" / "bin"


def ensure_binaries() -> Path:
    """Build (or find cached) the operator and apiload; returns their directory."""
    out = bin_dir()
    if (out / OPERATOR).exists() and (out / APILOAD).exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / OPERATOR).exists() and (out / APILOAD).exists():
            return out
        go = subprocess.run(["bash", str(REPO / "reconcilers" / "devstack" / "ensure-go.sh")], check=True,
                            capture_output=True, text=True).stdout.strip().splitlines()[-1]
        env = {**os.environ, "GOFLAGS": "-mod=mod -buildvcs=false", "CGO_ENABLED": "0",
               "GOPROXY": os.environ.get("GOPROXY", "https://proxy.golang.org")}
        for target, pkg in ((OPERATOR, "."), (APILOAD, "./cmd/apiload")):
            subprocess.run([go, "build", "-trimpath", "-ldflags", "-s -w", "-o",
                            str(out / f"{target}.tmp"), pkg], cwd=MODULE, env=env, check=True)
            (out / f"{target}.tmp").rename(out / target)
    return out


def go_module_versions() -> dict:
    text = (MODULE / "go.mod").read_text()
    want = ("sigs.k8s.io/controller-runtime", "k8s.io/client-go", "k8s.io/apimachinery")
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in want:
            out[parts[0]] = parts[1]
    go_line = next((l.split()[1] for l in text.splitlines() if l.startswith("go ")), "?")
    out["go directive"] = go_line
    return out


@dataclass
class ControllerRuntime(Impl):
    name: str = "cr-default"
    qps: float = 0  # 0: controller-runtime's default
    burst: int = 0
    max_concurrent_reconciles: int = 0  # 0: controller-runtime's default (1)

    def prepare(self) -> None:
        ensure_binaries()

    def start(self, trace: Path, sleep_ms: int = 0) -> None:
        argv = [str(bin_dir() / OPERATOR), "-trace", str(trace), "-sleep-ms", str(sleep_ms)]
        if self.qps:
            argv += ["-qps", str(self.qps), "-burst", str(self.burst)]
        if self.max_concurrent_reconciles:
            argv += ["-max-concurrent-reconciles", str(self.max_concurrent_reconciles)]
        env = self.base_env(trace, sleep_ms)
        env["GOMAXPROCS"] = os.environ.get("GOMAXPROCS", "")  # the machine's default
        if not env["GOMAXPROCS"]:
            env.pop("GOMAXPROCS")
        self.procs.append(self.spawn(self.name, argv, env))

    def describe(self) -> dict:
        return {
            "name": self.name,
            "version": go_module_versions(),
            "binary": str(bin_dir() / OPERATOR),
            "client_rate_limit": (f"QPS {self.qps:g} / burst {self.burst}" if self.qps else
                                  "controller-runtime v0.23 default: client-side limiter off "
                                  "(QPS -1), API Priority and Fairness only"),
            "settings": {
                "MaxConcurrentReconciles": (
                    f"{self.max_concurrent_reconciles} (this project's run threads)"
                    if self.max_concurrent_reconciles else "1 (default)"),
                "rate limiter": "default: max(per-item exponential 5 ms..1000 s, "
                                "bucket 10 qps / burst 100) - applies to requeues only",
                "cache": "informer cache, all namespaces, unstructured BenchItem read from the "
                         "cache (client.CacheOptions{Unstructured: true}; the default client "
                         "would GET unstructured objects live from the api-server)",
                "predicate": "GenerationChangedPredicate",
                "SyncPeriod": "default (10 h)",
                "leader election": "off (manager default)",
                "metrics / health listeners": "off (BindAddress 0)",
                "status write": "Status().Patch(MergeFrom with optimistic lock): merge patch "
                                "carrying resourceVersion, skipped when status already matches",
                "GOMAXPROCS": "default (all cores)",
            },
        }
