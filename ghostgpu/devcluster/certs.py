"""A throw-away PKI for the devcluster: one CA that signs the apiserver's serving cert, the admin
client cert, the kwok "kubelet" cert and the webhook serving certs of Kueue; plus the
service-account signing key. Everything is for 127.0.0.1 only."""

from __future__ import annotations

import datetime as dt
import fcntl
import ipaddress
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=30)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def is_matching_pair(cert: Path, key: Path) -> bool:
    """True when both files exist, parse, the key belongs to the cert and the cert is still valid."""
    try:
        crt = x509.load_pem_x509_certificate(cert.read_bytes())
        private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return False
    same = crt.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return same and crt.not_valid_after_utc > dt.datetime.now(dt.UTC) + dt.timedelta(days=1)


class CertAuthority:
    """Creates the CA in `directory` on first use and signs leaf certificates with it."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cert_path = directory / "ca.crt"
        self.key_path = directory / "ca.key"
        if not self.cert_path.exists():
            self._create()
        self._key = serialization.load_pem_private_key(self.key_path.read_bytes(), None)
        self._cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())

    def _create(self) -> None:
        key = _key()
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name("ghostgpu-devcluster-ca"))
            .issuer_name(_name("ghostgpu-devcluster-ca"))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            .sign(key, hashes.SHA256())
        )
        self.key_path.write_bytes(_pem_key(key))
        self.key_path.chmod(0o600)
        self.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    @property
    def pem(self) -> bytes:
        return self.cert_path.read_bytes()

    def issue(
        self,
        name: str,
        cn: str,
        *,
        org: str | None = None,
        server: bool = False,
        client: bool = False,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
    ) -> KeyPair:
        """Write <name>.crt/<name>.key signed by this CA (reused when they already exist)."""
        pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        if pair.cert.exists() and pair.key.exists():
            return pair
        key = _key()
        now = dt.datetime.now(dt.UTC)
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, org))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())  # type: ignore[arg-type]
        pair.key.write_bytes(_pem_key(key))
        pair.key.chmod(0o600)
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return pair


def service_account_keys(directory: Path) -> KeyPair:
    """The apiserver's service-account token signing key (private) and verification key (public)."""
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    if not pair.key.exists():
        key = _key()
        pair.key.write_bytes(_pem_key(key))
        pair.key.chmod(0o600)
        pair.cert.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return pair


def install_shared_pair(directory: Path, issue: Callable[[], KeyPair]) -> None:
    """Put a cert and its key at `directory`/tls.crt and tls.key, a path several devclusters on one
    host share: a valid pair already there is kept; otherwise `issue()` makes one, written under an
    exclusive lock and each file renamed into place so no reader sees half of one."""
    directory.mkdir(parents=True, exist_ok=True)
    crt, key = directory / "tls.crt", directory / "tls.key"
    with (directory / ".ghostgpu.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_matching_pair(crt, key):
            return
        pair = issue()
        for src, dst in ((pair.key, key), (pair.cert, crt)):
            tmp = dst.with_suffix(".tmp")
            shutil.copy(src, tmp)
            os.replace(tmp, dst)
