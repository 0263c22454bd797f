"""The serving pair and the CA the api-server trusts it by.

``ensure_certificates(directory, hosts)`` keeps the files it finds while the certificate names
every host and stays valid 30 days more, and otherwise makes a fresh CA and pair. Why: the CA
is what ``registration`` puts in the configurations' ``caBundle``, so a restart that reuses it
keeps the registration trusted; the 30-day margin means a server never starts on a pair about
to expire. In a cluster a Secret (or cert-manager) provides the pair instead, and
``_base.tls.CertificatePair`` reloads it when its files change.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from reconcilers._base import tls


@dataclass(frozen=True)
class Certificates:
    ca: Path
    cert: Path
    key: Path

    @property
    def ca_bundle(self) -> bytes:
        return self.ca.read_bytes()


def ensure_certificates(directory: Path, hosts: Sequence[str]) -> Certificates:
    """A CA (``ca.crt``) and a serving pair (``tls.crt``, ``tls.key``) for ``hosts``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    out = Certificates(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    if out.cert.exists() and _covers(out.cert.read_bytes(), hosts):
        return out
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "django-crd-operator webhook CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=3650))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = tls.subject_names(hosts)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    out.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    out.key.chmod(0o600)
    return out


def _covers(pem: bytes, hosts: Sequence[str]) -> bool:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pem)
    if cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc) \
            < datetime.timedelta(days=30):
        return False
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    have = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    have |= set(san.get_values_for_type(x509.DNSName))
    return set(hosts) <= have
