"""The secure ``/metrics`` port's serving pair (``_base.tls``): from files, followed as they
change, or self-signed. (``CertificatePair`` alone: tests/webhooks/test_server.py.)"""

from __future__ import annotations

import os
import socket
import ssl

import pytest
from cryptography import x509

from reconcilers._base import probes, tls
from tests.helpers import free_port, https_get, wait_for


def _serve(context) -> tuple[int, object]:
    endpoint = probes.Endpoint("test", lambda: {}, lambda: {})
    port = free_port()
    server = probes.serve(endpoint, port, paths=(probes.METRICS,), context=context)
    assert server is not None
    return port, server


def _served_names(port: int) -> set[str]:
    cert = x509.load_pem_x509_certificate(
        ssl.get_server_certificate(("127.0.0.1", port)).encode())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(san.get_values_for_type(x509.DNSName)) | {
        str(ip) for ip in san.get_values_for_type(x509.IPAddress)}


def test_without_a_pair_a_self_signed_one_naming_this_host_is_served():
    port, server = _serve(tls.serving(""))
    try:
        assert {"localhost", socket.gethostname(), "127.0.0.1"} <= _served_names(port)
        assert https_get(port, "/metrics")[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def test_the_pair_of_the_cert_dir_is_served(tmp_path):
    cert, key = tls.self_signed(["metrics.example", "127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    port, server = _serve(tls.serving(str(tmp_path)))
    try:
        assert _served_names(port) == {"metrics.example", "127.0.0.1"}
        # Verified against the pair's own certificate: that pair, and no other, is served.
        assert https_get(port, "/metrics", cafile=str(tmp_path / "tls.crt"))[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def _write_pair(directory, *hosts: str) -> None:
    """A pair as a Secret volume renews it: new files, then swapped into place."""
    cert, key = tls.self_signed(list(hosts))
    for name, pem in (("tls.crt", cert), ("tls.key", key)):
        (directory / f".{name}.new").write_bytes(pem)
        os.replace(directory / f".{name}.new", directory / name)


def test_a_renewed_pair_is_served_without_a_restart(tmp_path):
    """cert-manager renews the Secret under a running pod: the next connections get the new
    pair, as the webhook server's do."""
    _write_pair(tmp_path, "first.example", "127.0.0.1")
    port, server = _serve(tls.serving(str(tmp_path)))
    try:
        assert "first.example" in _served_names(port)
        _write_pair(tmp_path, "renewed.example", "127.0.0.1")
        wait_for(lambda: "renewed.example" in _served_names(port), timeout=15,
                 what="the renewed pair to be served")
        assert https_get(port, "/metrics", cafile=str(tmp_path / "tls.crt"))[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def test_a_cert_dir_without_its_pair_is_a_clear_error(tmp_path):
    (tmp_path / "tls.crt").write_bytes(tls.self_signed(["localhost"])[0])
    with pytest.raises(FileNotFoundError, match="tls.key"):
        tls.serving(str(tmp_path))
