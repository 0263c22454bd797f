"""Peak RSS of a watcher caching N Deployments: first list, the relist after a restart, and
the same with a selector-scoped cache.

    .venv/bin/python hack/watcher-memory.py [N] [SELECTED]   # on the local stack (make up)

A reconciler that owns Deployments (``bench/memoryapp``) caches every Deployment of the
namespace it watches. Each Deployment carries a 600-byte last-applied annotation (as
``kubectl apply`` leaves), which the cache drops. SELECTED of them (default 100) carry the
label ``memory/selected=yes``. Figures:

1. first list: a watcher starting with an empty cache;
2. relist after a restart: a new watcher whose first list diffs against the N objects
   already in the shared cache - the old and the new list both in memory, the peak that
   matters for the pod's memory limit;
3. scoped: ``Owns("apps/v1", "Deployment", selector="memory/selected=yes")`` - the watcher
   lists, watches and caches only the SELECTED ones; with the Redis bytes of each cache.

The figure is the kernel's high-water mark (VmHWM) of the watcher process once its streams
are synced. Deployments have replicas 0 (no Pods); the namespace is deleted at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from reconcilers.devstack.config import load  # noqa: E402


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    selected = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    cfg = load()
    os.environ["KUBECONFIG"] = str(cfg.kubeconfig)
    from kubernetes import client, config

    config.load_kube_config(str(cfg.kubeconfig))
    api_client = client.ApiClient()
    api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] = 16
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    namespace = f"memory-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: apps.create_namespaced_deployment(
                namespace, _deployment(i, i < selected)), range(n)))
        print(f"created {n} Deployments in {time.monotonic() - started:.0f}s", flush=True)
        env = {**os.environ, "OPERATOR_SAMPLES": "0", "OPERATOR_APPS": "bench.memoryapp",
               "RECONCILERS_NAMESPACES": namespace,
               "RECONCILERS_LEASE_NAME": f"memory-{namespace}", "LOG_LEVEL": "WARNING",
               "OPERATOR_WATCHER_HTTP_PORT": "0"}
        _forget_cache()
        first = _watcher_peak(env, namespace, n)
        whole_bytes = _cache_bytes()
        print(f"first list: peak RSS {first:.0f} MiB, Redis {whole_bytes / 2**20:.1f} MiB",
              flush=True)
        relist = _watcher_peak(env, namespace, n)
        print(f"relist after a restart (cache warm): peak RSS {relist:.0f} MiB", flush=True)
        _forget_cache()
        scoped = _watcher_peak({**env, "MEMORY_SELECTOR": "memory/selected=yes"}, namespace,
                               selected)
        scoped_bytes = _cache_bytes()
        print(f"scoped to {selected} of {n}: peak RSS {scoped:.0f} MiB, Redis "
              f"{scoped_bytes / 2**20:.2f} MiB", flush=True)
        print(json.dumps({"deployments": n, "first_list_mib": round(first),
                          "relist_mib": round(relist), "redis_mib": round(whole_bytes / 2**20, 1),
                          "selected": selected, "scoped_mib": round(scoped),
                          "scoped_redis_mib": round(scoped_bytes / 2**20, 2)}))
    finally:
        core.delete_namespace(namespace)


def _deployment(i: int, selected: bool) -> dict:
    labels = {"app": f"d{i}"}
    meta_labels = {**labels, "memory/selected": "yes"} if selected else labels
    body = {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": f"d{i}", "labels": meta_labels},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                         {"name": "app", "image": "registry.example/app:1"}]}}}}
    body["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps(body)[:600].ljust(600)}
    return body


def _watcher_peak(env: dict, namespace: str, n: int) -> float:
    """Start a watcher, wait until its Deployment stream is synced, read VmHWM, stop it."""
    from reconcilers._kube import cache  # noqa: F401  (Django must be set up: settings read env)

    proc = subprocess.Popen([sys.executable, "manage.py", "watch"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if _synced(namespace, n):
                break
            if proc.poll() is not None:
                raise RuntimeError(proc.stdout.read())
            time.sleep(1)
        else:
            raise RuntimeError("the watcher never synced")
        time.sleep(3)  # the enqueue of the last changes
        status = Path(f"/proc/{proc.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines()
                        if line.startswith("VmHWM:"))) / 1024
    finally:
        proc.terminate()
        proc.wait(30)


DEPLOYMENTS = "operator:obj:apps/v1/deployments"


def _forget_cache() -> None:
    from reconcilers._kube import cache

    cache.get_redis().delete(DEPLOYMENTS)


def _cache_bytes() -> int:
    from reconcilers._kube import cache

    return int(cache.get_redis().memory_usage(DEPLOYMENTS, samples=0) or 0)


def _synced(namespace: str, n: int) -> bool:
    from reconcilers._kube import cache
    from reconcilers._base.vocab import GVR

    gvr = GVR("apps", "v1", "deployments", "Deployment", True)
    return cache.is_synced(gvr, namespace) and len(cache.objects(gvr, namespace)) == n


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "operator_project.settings")
    os.environ.setdefault("DEBUG", "1")
    import django

    django.setup()
    main()
