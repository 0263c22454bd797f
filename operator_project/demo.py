"""``make demo`` (``python -m operator_project.demo``): this project on the local stack, in the foreground, until Ctrl-C.

Runs migrations, makes an admin user (password kept in ``.local/admin-password`` and printed),
then starts every role as a child process - web (the admin), a Celery worker (thread pool),
the watch workers (whose leader also sends the periodic tasks) and the admission webhook server (self-managed: its own certificates, registered
with ``failurePolicy: Ignore`` while it runs) - prefixing their output with the role's name. Ctrl-C (or
SIGTERM) stops them all and waits for them.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from reconcilers.conf import load_env_file

from reconcilers.devstack import config

REPO = Path(__file__).resolve().parent.parent


def _manage(*args: str) -> list[str]:
    return [sys.executable, str(REPO / "manage.py"), *args]


def _role_commands(cfg: config.StackConfig, port: int,
                   webhook_port: int) -> dict[str, list[str]]:
    commands = {
        "web": _manage("runserver", f"127.0.0.1:{port}", "--noreload"),
        "worker": [sys.executable, "-m", "celery", "-A", "operator_project", "worker",
                   "--loglevel", "INFO", "--pool", "threads", "--concurrency", "8",
                   "--without-gossip", "--without-mingle"],
    }
    if (REPO / "reconcilers" / "management" / "commands" / "watch.py").exists():
        commands["watcher"] = _manage("watch")
    # Ignore, not Fail: a demo killed before it could unregister leaves the stack's writes
    # unchecked rather than refused.
    commands["webhook"] = _manage(
        "webhook", "serve", "--bind", "127.0.0.1", "--port", str(webhook_port),
        "--certs-dir", str(cfg.state_dir / "webhook"), "--host", "127.0.0.1", "--register",
        "--failure-policy", "Ignore")
    return commands


def _admin_password(cfg: config.StackConfig) -> str:
    path = cfg.state_dir / "admin-password"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(12))
        path.chmod(0o600)
    return path.read_text().strip()


def _apply_samples(kubeconfig: str, stopping: threading.Event) -> None:
    """Create the sample objects once the watcher has installed their CRDs."""
    kubectl = Path(os.environ.get("OPERATOR_CONTROL_PLANE_BIN", "")) / "kubectl"
    contrib = REPO / "reconcilers" / "contrib"
    examples = [contrib / "samplecontroller" / "examples", contrib / "podset" / "examples"]
    for _ in range(120):
        out = subprocess.run([str(kubectl), "apply", *(f"--filename={e}" for e in examples)],
                             env={**os.environ, "KUBECONFIG": kubeconfig},
                             capture_output=True, text=True)
        if out.returncode == 0:
            print("    demo | " + out.stdout.strip().replace("\n", "\n    demo | "), flush=True)
            return
        if stopping.wait(0.5):
            return
    print(f"    demo | could not create the sample objects: {out.stderr.strip()}", flush=True)


def _pump(name: str, stream, out) -> None:
    for line in iter(stream.readline, b""):
        out.write(f"{name:>8} | {line.decode(errors='replace')}")
        out.flush()


def main() -> int:
    cfg = config.load()
    load_env_file(cfg.env_file)
    port = int(os.environ.get("OPERATOR_DEMO_PORT", "8000"))
    webhook_port = int(os.environ.get("OPERATOR_DEMO_WEBHOOK_PORT", "9443"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DJANGO_SETTINGS_MODULE": "operator_project.settings"}
    password = _admin_password(cfg)

    subprocess.run(_manage("migrate", "--noinput", "-v", "0"), check=True, env=env)
    subprocess.run(_manage("ensureadmin"), check=True,
                   env={**env, "DJANGO_SUPERUSER_USERNAME": "admin",
                        "DJANGO_SUPERUSER_PASSWORD": password})

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())

    children: dict[str, subprocess.Popen] = {}
    for name, argv in _role_commands(cfg, port, webhook_port).items():
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        children[name] = proc
        threading.Thread(target=_pump, args=(name, proc.stdout, sys.stdout), daemon=True).start()

    if "watcher" in children:
        threading.Thread(target=_apply_samples, args=(str(cfg.kubeconfig), stopping),
                         daemon=True).start()
    print(
        "\n"
        f"  Admin:      http://127.0.0.1:{port}/admin/\n"
        f"  Login:      admin / {password}\n"
        f"  Kubeconfig: {cfg.kubeconfig}   (kubectl: {os.environ.get('OPERATOR_CONTROL_PLANE_BIN', '')}/kubectl)\n"
        f"  Running:    {', '.join(children)}\n"
        "  Sample:     kubectl get foos,deployments,pods  (the Foo 'example-foo' owns a Deployment;\n"
        "              its Pods run on simulated nodes and status.availableReplicas follows)\n"
        "  Scale it:   kubectl patch foo example-foo --type merge -p '{\"spec\":{\"replicas\":3}}'\n"
        "              and the PodSet 'example-podset' (the talk's ReplicaSet): kubectl get podsets\n"
        f"  Webhooks:   https://127.0.0.1:{webhook_port} - a Foo without replicas gets 1, a second\n"
        "              Foo naming the same Deployment is refused (admin -> Webhook calls),\n"
        "              and v1 is converted: kubectl get foos.v1.samplecontroller.k8s.io -o yaml\n"
        "  History:    python manage.py history foos.samplecontroller.k8s.io default/example-foo\n"
        "  Ctrl-C stops everything started here (make down stops the stack).\n",
        flush=True,
    )

    exit_code = 0
    while not stopping.is_set():
        for name, proc in children.items():
            if proc.poll() is not None:
                print(f"demo: {name} exited with {proc.returncode}; stopping", flush=True)
                exit_code = 1
                stopping.set()
                break
        stopping.wait(0.5)

    print("demo: stopping " + ", ".join(children), flush=True)
    for proc in children.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for proc in children.values():
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print("demo: stopped", flush=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
