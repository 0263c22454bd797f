"""Serving pairs: one that follows its files (``CertificatePair``, the webhook server's and the
secure ``/metrics``'s), and the secure ``/metrics``'s context (``serving``).

``/metrics`` (``RECONCILERS_METRICS_SECURE``) serves the pair of
``RECONCILERS_METRICS_CERT_DIR`` (``tls.crt`` and ``tls.key``, the keys of a
``kubernetes.io/tls`` Secret, and controller-runtime's default names), reloaded when
cert-manager renews it, else a self-signed pair made at start, as controller-runtime's metrics
server makes one when given no certificate. Its scrapers (Prometheus with
``insecure_skip_verify``, as kubebuilder's ServiceMonitor) are not asked to trust it: TLS is
there so that the bearer token each scrape carries cannot be read on the way, and the caller
is proved by that token, never by the certificate. The self-signed key never touches the disk
past the load: its files are written to a private directory, read into the context and
removed.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import shutil
import socket
import ssl
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

log = logging.getLogger(__name__)

CERT = "tls.crt"
KEY = "tls.key"


def serving(cert_dir: str = "") -> Callable[[], ssl.SSLContext]:
    """The context to serve each connection with: the pair of ``cert_dir``, followed as its
    files change (``CertificatePair``), or a self-signed one for this host. A directory
    without both files is a clear error, not a silent self-signed pair."""
    if cert_dir:
        cert, key = Path(cert_dir) / CERT, Path(cert_dir) / KEY
        missing = [str(p) for p in (cert, key) if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"RECONCILERS_METRICS_CERT_DIR={cert_dir!r}: no "
                                    f"{' and no '.join(missing)}")
        return CertificatePair(cert, key, name="metrics").context
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    made = Path(tempfile.mkdtemp(prefix="operator-metrics-tls-"))
    try:
        cert_pem, key_pem = self_signed(["localhost", socket.gethostname(), "127.0.0.1", "::1"])
        (made / CERT).write_bytes(cert_pem)
        (made / KEY).write_bytes(key_pem)
        context.load_cert_chain(made / CERT, made / KEY)
    finally:
        shutil.rmtree(made, ignore_errors=True)
    return lambda: context


class CertificatePair:
    """The serving pair as an ``SSLContext``, rebuilt when ``cert`` or ``key`` changes.

    A change is seen by ``stat`` (inode, size, mtime of each, through symlinks), looked at no
    more than once every ``every`` seconds. A pair that fails to load - the key written
    before the certificate by a tool that does not swap atomically - keeps the previous
    context and is tried again at the next look."""

    def __init__(self, cert: Path, key: Path, every: float = 1.0, name: str = "serving"):
        self.cert, self.key, self.every, self.name = Path(cert), Path(key), every, name
        self._lock = threading.Lock()
        self._looked = time.monotonic()
        self._stamp = self._stamp_now()
        self._context, self.not_after = self._load()  # a bad pair at start is an error
        self.loaded_at = time.time()

    def context(self) -> ssl.SSLContext:
        if time.monotonic() - self._looked >= self.every:
            with self._lock:
                if time.monotonic() - self._looked >= self.every:
                    self._looked = time.monotonic()
                    self._reload_if_changed()
        return self._context

    def _reload_if_changed(self) -> None:
        try:
            stamp = self._stamp_now()
        except OSError as exc:  # mid-swap: a file is briefly missing
            log.warning("%s certificate unreadable, serving the previous pair: %s", self.name,
                        exc)
            return
        if stamp == self._stamp:
            return
        try:
            self._context, self.not_after = self._load()
        except (OSError, ValueError, ssl.SSLError) as exc:
            log.warning("%s certificate changed but does not load, serving the previous "
                        "pair: %s", self.name, exc)
            return
        self._stamp, self.loaded_at = stamp, time.time()
        log.info("%s certificate reloaded from %s (valid until %s)", self.name, self.cert,
                 self.not_after.isoformat())

    def _stamp_now(self) -> tuple:
        return tuple((s.st_ino, s.st_size, s.st_mtime_ns)
                     for s in (os.stat(self.cert), os.stat(self.key)))

    def _load(self) -> tuple[ssl.SSLContext, datetime.datetime]:
        from cryptography import x509

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self.cert), str(self.key))
        not_after = x509.load_pem_x509_certificate(self.cert.read_bytes()).not_valid_after_utc
        return context, not_after

    def ready(self) -> tuple[bool, str]:
        """Whether the pair served can still be trusted, and what to say about it."""
        left = self.not_after - datetime.datetime.now(datetime.timezone.utc)
        if left.total_seconds() <= 0:
            return False, f"the serving certificate expired at {self.not_after.isoformat()}"
        return True, f"certificate valid until {self.not_after.isoformat()}"


def self_signed(hosts: Sequence[str], days: int = 365) -> tuple[bytes, bytes]:
    """A certificate (PEM) naming ``hosts``, signed by its own key, and that key (PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{hosts[0]} metrics")])
    sans = subject_names(dict.fromkeys(hosts))
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


def subject_names(hosts: Iterable[str]) -> list:
    """A certificate's SubjectAlternativeName entries for ``hosts``: an IP address as one, any
    other host as a DNS name (a client checks an IP against IP entries only)."""
    from cryptography import x509

    return [x509.IPAddress(ipaddress.ip_address(h)) if _is_ip(h) else x509.DNSName(h)
            for h in hosts]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
