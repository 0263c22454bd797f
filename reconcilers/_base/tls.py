"""The TLS context the secure ``/metrics`` port serves with (``RECONCILERS_METRICS_SECURE``).

A pair from files when ``RECONCILERS_METRICS_CERT_DIR`` names a directory (``tls.crt`` and
``tls.key``, the keys of a ``kubernetes.io/tls`` Secret, and controller-runtime's default
names), else a self-signed pair made at start, as controller-runtime's metrics server makes
one when given no certificate. Its scrapers (Prometheus with ``insecure_skip_verify``, as
kubebuilder's ServiceMonitor) are not asked to trust it: TLS is there so that the bearer token
each scrape carries cannot be read on the way, and the caller is proved by that token, never
by the certificate. The self-signed key never touches the disk past the load: its files are
written to a private directory, read into the context and removed.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import socket
import ssl
import tempfile
from pathlib import Path
from typing import Sequence

CERT = "tls.crt"
KEY = "tls.key"


def server_context(cert_dir: str = "") -> ssl.SSLContext:
    """A server context with the pair of ``cert_dir``, or a self-signed one for this host.
    A directory without both files is a clear error, not a silent self-signed pair."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_dir:
        cert, key = Path(cert_dir) / CERT, Path(cert_dir) / KEY
        missing = [str(p) for p in (cert, key) if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"RECONCILERS_METRICS_CERT_DIR={cert_dir!r}: no "
                                    f"{' and no '.join(missing)}")
        context.load_cert_chain(cert, key)
        return context
    made = Path(tempfile.mkdtemp(prefix="operator-metrics-tls-"))
    try:
        cert_pem, key_pem = self_signed(["localhost", socket.gethostname(), "127.0.0.1", "::1"])
        (made / CERT).write_bytes(cert_pem)
        (made / KEY).write_bytes(key_pem)
        context.load_cert_chain(made / CERT, made / KEY)
    finally:
        shutil.rmtree(made, ignore_errors=True)
    return context


def self_signed(hosts: Sequence[str], days: int = 365) -> tuple[bytes, bytes]:
    """A certificate (PEM) naming ``hosts``, signed by its own key, and that key (PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{hosts[0]} metrics")])
    sans = [x509.IPAddress(ipaddress.ip_address(h)) if _is_ip(h) else x509.DNSName(h)
            for h in dict.fromkeys(hosts)]
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
