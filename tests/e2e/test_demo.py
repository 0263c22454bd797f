"""`make demo` starts every role, serves the admin, and stops cleanly on Ctrl-C."""

from __future__ import annotations

import signal
import socket
import sys
import urllib.request

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_demo_prints_admin_login_serves_it_and_stops_on_ctrl_c(start_process):
    port = _free_port()
    demo = start_process("demo", [sys.executable, "-m", "devstack.demo"],
                         env={"OPERATOR_DEMO_PORT": str(port)})
    demo.wait_for_log("Login:      admin / ", timeout=90)
    demo.wait_for_log("celery@", timeout=60)
    demo.wait_for_log(f"Starting development server at http://127.0.0.1:{port}/", timeout=60)

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/", timeout=10) as resp:
        assert resp.status == 200
        assert b"csrfmiddlewaretoken" in resp.read()

    demo.popen.send_signal(signal.SIGINT)
    assert demo.popen.wait(timeout=40) == 0
    assert "demo: stopped" in demo.log()
