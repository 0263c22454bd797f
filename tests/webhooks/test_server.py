"""The webhook server's parts without a server: the certificate pair that follows its files,
and the WSGI application's readiness and controller-runtime figures."""

from __future__ import annotations

import io
import os
import shutil
import time

from reconcilers._base import metrics
from reconcilers._webhooks import certificates, server


def _pair_der(context) -> bytes:
    """The certificate a context serves, by a handshake over memory."""
    import ssl

    client = ssl.create_default_context()
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    tls_client = client.wrap_bio(c_in, c_out)
    tls_server = context.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side in (tls_client, tls_server):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    return tls_client.getpeercert(binary_form=True)


def _der(path) -> bytes:
    import ssl

    return ssl.PEM_cert_to_DER_cert(path.read_text())


def test_a_replaced_pair_is_served_from_the_next_look_and_a_broken_one_keeps_the_old(tmp_path):
    first = certificates.ensure_certificates(tmp_path / "a", ["127.0.0.1"])
    second = certificates.ensure_certificates(tmp_path / "b", ["127.0.0.1"])
    live = tmp_path / "live"
    shutil.copytree(tmp_path / "a", live)
    pair = server.CertificatePair(live / "tls.crt", live / "tls.key", every=0)
    assert _pair_der(pair.context()) == _der(first.cert)
    assert pair.ready()[0] and "valid until" in pair.ready()[1]

    # The key written first, the certificate not yet: the old pair stays.
    shutil.copy(second.key, live / "tls.key")
    assert _pair_der(pair.context()) == _der(first.cert)
    shutil.copy(second.cert, live / "tls.crt")
    assert _pair_der(pair.context()) == _der(second.cert)

    # A file missing for a moment (mid-swap) keeps the pair too.
    os.rename(live / "tls.crt", live / "gone")
    assert _pair_der(pair.context()) == _der(second.cert)


def test_the_files_are_looked_at_no_more_than_every_interval(tmp_path):
    certificates.ensure_certificates(tmp_path / "a", ["127.0.0.1"])
    second = certificates.ensure_certificates(tmp_path / "b", ["127.0.0.1"])
    live = tmp_path / "live"
    shutil.copytree(tmp_path / "a", live)
    pair = server.CertificatePair(live / "tls.crt", live / "tls.key", every=0.3)
    before = pair.context()
    shutil.copy(second.key, live / "tls.key")
    shutil.copy(second.cert, live / "tls.crt")
    assert pair.context() is before
    time.sleep(0.35)
    assert _pair_der(pair.context()) == _der(second.cert)


def _call(method: str, path: str, body: bytes = b"") -> tuple[str, bytes]:
    seen = {}

    def start_response(status, headers):
        seen["status"] = status

    result = server.application({
        "REQUEST_METHOD": method, "PATH_INFO": path, "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body)}, start_response)
    data = b"".join(result)
    if hasattr(result, "close"):
        result.close()
    return seen["status"], data


def test_readyz_follows_the_pair_and_hook_calls_are_counted_by_path(tmp_path, monkeypatch):
    monkeypatch.setattr(server, "_pair", None)
    assert _call("GET", "/readyz")[0].startswith("503")
    made = certificates.ensure_certificates(tmp_path, ["127.0.0.1"])
    monkeypatch.setattr(server, "_pair",
                        server.CertificatePair(made.cert, made.key))
    assert _call("GET", "/readyz")[0] == "200 OK"

    server.count_from_zero()
    assert _call("POST", "/validate", b"{not json")[0].startswith("400")
    status, text = _call("GET", "/metrics")
    assert status == "200 OK"
    if metrics.ENABLED:
        assert b'controller_runtime_webhook_requests_total{code="400",webhook="/validate"}' \
            in text
        assert b'controller_runtime_webhook_requests_total{code="500",webhook="/convert"} 0.0' \
            in text
        assert b'controller_runtime_webhook_requests_in_flight{webhook="/validate"} 0.0' in text
