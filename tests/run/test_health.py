"""The worker's ``manage.py health`` (``_run.health``): its node name read from its command line,
and a real Celery worker process answering a ping, then stopped."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from reconcilers._run import health as worker_health


def test_the_worker_node_name_is_read_from_its_command_line():
    argv = ["/opt/venv/bin/python", "-m", "celery", "-A", "operator_project", "worker",
            "--hostname", "worker-1a2b3c4d@%h"]

    script = ["/opt/venv/bin/python", "/opt/venv/bin/celery", "-A", "x"]

    assert worker_health.worker_node(argv) == f"worker-1a2b3c4d@{socket.gethostname()}"
    assert worker_health.worker_node([*script, "worker"]) == f"celery@{socket.gethostname()}"
    assert worker_health.worker_node([*script, "beat"]) is None
    assert worker_health.worker_node(["/sbin/docker-init", "--", *script, "worker"]) is None
    assert worker_health.worker_node(["python", "manage.py", "health", "worker"]) is None


@pytest.mark.django_db(transaction=True)
def test_worker_is_healthy_while_it_answers_a_ping_and_unhealthy_once_stopped(celery_worker):
    worker = celery_worker()
    argv = Path(f"/proc/{worker.pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")
    node = worker_health.worker_node(argv)

    call_command("health", "worker", "--node", node)

    worker.stop()
    with pytest.raises(CommandError, match=f"no reply from {node}"):
        call_command("health", "worker", "--node", node, "--timeout", "1")
