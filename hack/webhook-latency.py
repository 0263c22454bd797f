"""What the sample Foo's admission webhooks add to a write, measured through the api-server.

    .venv/bin/python hack/webhook-latency.py [N]      # on the local stack (make up)

N dry-run creates of a Foo (nothing is stored, every admission step runs) without webhooks,
then N with the validating webhook (which LISTs the namespace's Foos) and the mutating webhook
registered: p50/p99 of the client-observed time of each, the ratio, and the server's own time
per call (from its WebhookCall records). Then the same N with the same two webhooks written
for kopf (bench/peers/kopf/webhooks.py, kopf's pinned venv), registered the same way with the
same certificate: the peer's figure in the same run.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    from kubernetes import client

    from reconcilers._authoring import crds
    from reconcilers._kube import kube
    from reconcilers.models import WebhookCall

    api = kube.api_client()
    foo_crd = REPO / "reconcilers/contrib/samplecontroller/crds/foos.samplecontroller.k8s.io.yaml"
    crds.apply_manifest(api, foo_crd)
    core, objs = client.CoreV1Api(api), client.CustomObjectsApi(api)
    namespace = f"webhook-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace, "labels": {"bench": namespace}}})
    tmp = Path(tempfile.mkdtemp(prefix="webhook-bench-"))
    port = _free_port()
    manage = [sys.executable, "manage.py", "webhook"]
    server = None
    try:
        subprocess.run([*manage, "certs", "--dir", str(tmp), "--host", "127.0.0.1"], cwd=REPO,
                       check=True, capture_output=True)

        def create(i: int, spec_replicas: bool = True):
            body = {"apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
                    "metadata": {"name": f"f{i}"}, "spec": {"deploymentName": f"d{i}"}}
            started = time.perf_counter()
            got = objs.create_namespaced_custom_object("samplecontroller.k8s.io", "v1alpha1",
                                                       namespace, "foos", body, dry_run="All")
            return (time.perf_counter() - started) * 1000 if spec_replicas else got

        for i in range(20):
            create(i)  # warm connections and caches
        without = [create(i) for i in range(n)]
        server = subprocess.Popen([*manage, "serve", "--bind", "127.0.0.1", "--port", str(port),
                                   "--cert", str(tmp / "tls.crt"), "--key", str(tmp / "tls.key")],
                                  cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        subprocess.run([*manage, "register", "--url", f"https://127.0.0.1:{port}", "--ca",
                        str(tmp / "ca.crt"), "--name", namespace, "--namespace-label",
                        f"bench={namespace}", "--only", "admission"], cwd=REPO, check=True,
                       capture_output=True)
        deadline = time.monotonic() + 30
        while WebhookCall.objects.filter(namespace=namespace).count() < 2:
            create(0)
            if time.monotonic() > deadline:
                raise RuntimeError("the webhooks were never called")
        for i in range(20):
            create(i)
        since = time.time()
        with_hooks = [create(i) for i in range(n)]
        calls = WebhookCall.objects.filter(namespace=namespace, at__gte=_aware(since))
        server_ms = {hook: sorted(calls.filter(hook=hook).values_list("duration_ms", flat=True))
                     for hook in ("validate", "mutate")}
        report = {
            "creates": n,
            "without_webhooks_ms": _percentiles(without),
            "with_webhooks_ms": _percentiles(with_hooks),
            "ratio_p50": round(statistics.median(with_hooks) / statistics.median(without), 2),
            "server_validate_ms": _percentiles(server_ms["validate"]),
            "server_mutate_ms": _percentiles(server_ms["mutate"]),
        }
        server.terminate()
        server.wait(15)
        server = _start_kopf(tmp, port := _free_port())
        subprocess.run([*manage, "register", "--url", f"https://127.0.0.1:{port}", "--ca",
                        str(tmp / "ca.crt"), "--name", namespace, "--namespace-label",
                        f"bench={namespace}", "--only", "admission"], cwd=REPO, check=True,
                       capture_output=True)
        deadline = time.monotonic() + 60
        while True:  # kopf answering, and the new configuration in the admission chain
            try:
                if create(0, spec_replicas=False)["spec"].get("replicas") == 1:
                    break
            except client.ApiException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("kopf's webhooks were never called:\n"
                                   + (tmp / "kopf.log").read_text()[-3000:])
            time.sleep(0.2)
        for i in range(20):
            create(i)
        with_kopf = [create(i) for i in range(n)]
        report["kopf_with_webhooks_ms"] = _percentiles(with_kopf)
        report["ratio_p50_vs_kopf"] = round(statistics.median(with_hooks)
                                            / statistics.median(with_kopf), 2)
        print(json.dumps(report, indent=2))
    finally:
        subprocess.run([*manage, "unregister", "--name", namespace], cwd=REPO,
                       capture_output=True)
        if server is not None:
            server.terminate()
            server.wait(15)
        core.delete_namespace(namespace)


def _start_kopf(tmp: Path, port: int) -> subprocess.Popen:
    from bench.impls.kopf_impl import ensure_venv

    venv = ensure_venv()
    return subprocess.Popen(
        [str(venv / "bin" / "python"), "-m", "kopf", "run", "--standalone", "--all-namespaces",
         "--quiet", str(REPO / "bench" / "peers" / "kopf" / "webhooks.py")],
        env={**os.environ, "BENCH_WEBHOOK_PORT": str(port),
             "BENCH_WEBHOOK_CERT": str(tmp / "tls.crt"), "BENCH_WEBHOOK_KEY": str(tmp / "tls.key")},
        stdout=open(tmp / "kopf.log", "wb"), stderr=subprocess.STDOUT)


def _percentiles(values: list[float]) -> dict:
    values = sorted(values)
    if not values:
        return {}
    return {"p50": round(values[len(values) // 2], 2),
            "p99": round(values[min(len(values) - 1, int(len(values) * 0.99))], 2)}


def _aware(ts: float):
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ts, timezone.utc)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "operator_project.settings")
    os.environ.setdefault("DEBUG", "1")
    import django

    django.setup()
    main()
