"""Peak RSS of a watcher caching N Deployments: first list, and the relist after a restart.

    .venv/bin/python hack/watcher-memory.py [N]      # on the local stack (make up)

The sample Foo operator owns Deployments, so its watcher caches every Deployment of the
namespace it watches. Each Deployment carries a 600-byte last-applied annotation (as
``kubectl apply`` leaves), which the cache drops. Two figures:

1. first list: a watcher starting with an empty cache;
2. relist after a restart: a new watcher whose first list diffs against the 10,000 objects
   already in the shared cache - the old and the new list both in memory, the peak that
   matters for the pod's memory limit.

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
            list(pool.map(lambda i: apps.create_namespaced_deployment(namespace, _deployment(i)),
                          range(n)))
        print(f"created {n} Deployments in {time.monotonic() - started:.0f}s", flush=True)
        env = {**os.environ, "OPERATOR_SAMPLES": "1", "RECONCILERS_NAMESPACES": namespace,
               "RECONCILERS_LEASE_NAME": f"memory-{namespace}", "LOG_LEVEL": "WARNING",
               "OPERATOR_WATCHER_HTTP_PORT": "0"}
        first = _watcher_peak(env, namespace, n)
        print(f"first list: peak RSS {first:.0f} MiB", flush=True)
        relist = _watcher_peak(env, namespace, n)
        print(f"relist after a restart (cache warm): peak RSS {relist:.0f} MiB", flush=True)
        print(json.dumps({"deployments": n, "first_list_mib": round(first),
                          "relist_mib": round(relist)}))
    finally:
        core.delete_namespace(namespace)


def _deployment(i: int) -> dict:
    labels = {"app": f"d{i}"}
    body = {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": f"d{i}", "labels": labels},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                         {"name": "app", "image": "registry.example/app:1"}]}}}}
    body["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps(body)[:600].ljust(600)}
    return body


def _watcher_peak(env: dict, namespace: str, n: int) -> float:
    """Start a watcher, wait until its Deployment stream is synced, read VmHWM, stop it."""
    from reconcilers import cache  # noqa: F401  (Django must be set up: settings read env)

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


def _synced(namespace: str, n: int) -> bool:
    from reconcilers import cache
    from reconcilers.vocab import GVR

    gvr = GVR("apps", "v1", "deployments", "Deployment", True)
    return cache.is_synced(gvr, namespace) and len(cache.objects(gvr, namespace)) == n


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "operator_project.settings")
    os.environ.setdefault("DEBUG", "1")
    import django

    django.setup()
    main()
