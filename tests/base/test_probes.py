"""The ports a watcher or a worker serves (``_base.probes.start``): where they listen, and what
is left when the secure ``/metrics`` cannot be served. (Served over HTTPS behind the
api-server's reviews: tests/kube/test_reviews.py; each role's checks: tests/web/test_health.py,
tests/watch/test_health.py, tests/run/test_health.py.)"""

from __future__ import annotations

import logging

from reconcilers._base import probes
from tests.helpers import free_port


def _endpoint() -> probes.Endpoint:
    return probes.Endpoint("test", lambda: {"loop": True}, lambda: {"ready": True})


def _stop(servers) -> None:
    for server in servers:
        server.shutdown()
        server.server_close()


def test_the_ports_listen_on_every_interface_unless_told_otherwise():
    """The kubelet probes the pod's address; outside a cluster ``OPERATOR_HTTP_HOST`` keeps
    both ports on the machine."""
    servers = probes.start(_endpoint(), free_port(), free_port(),
                           probes.Secure(lambda _: None), host="127.0.0.1")
    try:
        assert [s.server_address[0] for s in servers] == ["127.0.0.1", "127.0.0.1"]
    finally:
        _stop(servers)
    servers = probes.start(_endpoint(), free_port())
    try:
        assert [s.server_address[0] for s in servers] == ["0.0.0.0"]
    finally:
        _stop(servers)


def test_a_pair_that_cannot_be_loaded_leaves_the_probes_served(tmp_path, caplog):
    """Metrics must never stop the work they observe, nor the probes that watch it."""
    endpoint = _endpoint()
    probe_port, metrics_port = free_port(), free_port()
    with caplog.at_level(logging.ERROR, logger="reconcilers._base.probes"):
        servers = probes.start(endpoint, probe_port, metrics_port,
                               probes.Secure(lambda _: None, str(tmp_path)))
    try:
        assert len(servers) == 1
        assert "cannot serve /metrics over HTTPS" in caplog.text and "tls.crt" in caplog.text
    finally:
        _stop(servers)
