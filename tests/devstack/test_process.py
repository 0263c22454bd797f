"""The local stack's pid files name processes it started, and only those (real processes)."""

from __future__ import annotations

import subprocess
import time

import pytest

from reconcilers.devstack import process


@pytest.fixture
def bystander():
    """A process the stack did not start, leading its own group as spawned services do."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    # Start times count clock ticks; a reused number belongs to a process started later.
    time.sleep(0.05)
    yield proc
    proc.kill()
    proc.wait()


def test_a_spawned_service_is_found_again_and_stopped(tmp_path):
    pid = process.spawn("svc", ["sleep", "600"], tmp_path / "run", tmp_path / "log")
    assert process.read_pid(tmp_path / "run" / "svc.pid") == pid
    assert process.stop("svc", tmp_path / "run", timeout=5)
    assert not process.pid_alive(pid)
    assert not (tmp_path / "run" / "svc.pid").exists()


def test_a_pid_file_whose_number_was_reused_is_not_trusted(tmp_path, bystander):
    """After a reset killed the stack, its pid files stay; an unrelated process that now holds
    the number must be neither taken for the service nor signalled by ``make down``."""
    run = tmp_path / "run"
    pid = process.spawn("svc", ["sleep", "600"], run, tmp_path / "log")
    pid_file = run / "svc.pid"
    left_behind = pid_file.read_text()
    process.stop("svc", run, timeout=5)
    # The file as the killed stack left it, its number since reused by the bystander.
    pid_file.write_text(left_behind.replace(str(pid), str(bystander.pid), 1))
    assert process.read_pid(pid_file) is None
    assert not process.stop("svc", run, timeout=5)
    assert bystander.poll() is None, "stop signalled a process the stack did not start"
