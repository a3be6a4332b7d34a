"""A self-signed serving certificate for the admission webhook on the local cluster.

In a real cluster the chart gets its certificate from cert-manager (or generates one); locally the API
server calls the operator on loopback, so a self-signed certificate whose CA bundle Kopf registers
in the webhook configuration is enough.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def subject_alt_name(host: str) -> x509.GeneralName:
    """An IP address SAN for an IP literal, else a DNS name SAN."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def self_signed(directory: Path, hosts: list[str], days: int = 365) -> tuple[Path, Path]:
    """(certfile, keyfile) in ``directory``, reused while valid for these hosts."""
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "webhook.crt", directory / "webhook.key"
    if cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        names = {str(n.value) for n in cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value}
        if set(hosts) <= names and cert.not_valid_after_utc > datetime.datetime.now(datetime.UTC):
            return cert_path, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([subject_alt_name(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path
