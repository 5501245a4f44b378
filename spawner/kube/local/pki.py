"""The certificates and keys of a local control plane: one CA that signs every serving and client certificate,
and the key pair that signs service-account tokens.

Who a client is comes from its certificate, as in a kubeadm cluster: the common name is the user, the
organisations are the groups. So the scheduler is ``system:kube-scheduler``, each node's kubelet is
``system:node:<name>`` in ``system:nodes`` (what the Node authorizer and the NodeRestriction admission plugin
recognise), and the admin is in ``system:masters``.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = datetime.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


class Authority:
    """A CA kept in ``folder``: made on first use, reused afterwards; it issues certificates into the same
    folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.ca = KeyPair(folder / "ca.crt", folder / "ca.key")
        if not self.ca.cert.exists():
            key = ec.generate_private_key(ec.SECP256R1())
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpupool-local-ca")])
            cert = (
                _builder(name, name, key.public_key())
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256())
            )
            _save(self.ca, cert, key)
        self._key = serialization.load_pem_private_key(self.ca.key.read_bytes(), password=None)
        self._cert = x509.load_pem_x509_certificate(self.ca.cert.read_bytes())

    def issue(
        self,
        name: str,
        common_name: str,
        groups: tuple[str, ...] = (),
        *,
        server_names: tuple[str, ...] = (),
    ) -> KeyPair:
        """A certificate for ``common_name`` in ``groups``, saved as ``<name>.crt``/``.key``; ``server_names``
        (DNS names and IP addresses) make it a serving certificate too."""
        pair = KeyPair(self.folder / f"{name}.crt", self.folder / f"{name}.key")
        if pair.cert.exists():
            return pair
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name(
            [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
            + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        )
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + (
            [ExtendedKeyUsageOID.SERVER_AUTH] if server_names else []
        )
        builder = (
            _builder(subject, self._cert.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if server_names:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_general_name(n) for n in server_names]), critical=False
            )
        cert = builder.sign(self._key, hashes.SHA256())  # type: ignore[arg-type]
        _save(pair, cert, key)
        return pair


def client_tls(ca: Path, client: KeyPair) -> ssl.SSLContext:
    """TLS settings of a client that trusts ``ca`` and presents ``client``'s certificate."""
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(client.cert), str(client.key))
    return context


def service_account_keys(folder: Path) -> KeyPair:
    """The RSA key pair that signs service-account tokens (``cert`` holds the public key)."""
    pair = KeyPair(folder / "service-account.pub", folder / "service-account.key")
    if not pair.key.exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pair.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        pair.key.chmod(0o600)
        pair.cert.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return pair


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALID)
    )


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _save(pair: KeyPair, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    pair.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    pair.key.chmod(0o600)
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
