"""TLS for SSL and SASL_SSL listeners: contexts from PEM files, principals from certificates, and
a development CA.

Kafka's names, PEM contents: ``ssl.keystore.location`` is one PEM file holding the broker's
certificate (then its chain) and private key (``ssl.key.password`` if encrypted);
``ssl.truststore.location`` holds the CAs that client certificates must chain to, checked when
``ssl.client.auth`` is ``requested`` or ``required``. A client that presented a certificate is
``User:<subject DN>`` (RFC 2253, as Kafka's default principal builder), else ``User:ANONYMOUS``.

``make_dev_certs`` makes a throwaway CA and a broker certificate for the given hosts, so a
development cluster (and the tests) can run TLS listeners that real clients verify.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diskless.config import BrokerConfig

from .session import ANONYMOUS


def server_context(config: BrokerConfig) -> ssl.SSLContext:
    assert config.ssl_keystore_location, "validate_listeners requires a keystore for TLS listeners"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.ssl_keystore_location, password=config.ssl_key_password)
    if config.ssl_truststore_location:
        context.load_verify_locations(config.ssl_truststore_location)
    context.verify_mode = {
        "none": ssl.CERT_NONE,
        "requested": ssl.CERT_OPTIONAL,
        "required": ssl.CERT_REQUIRED,
    }[config.ssl_client_auth]
    return context


def client_context(truststore: str | None, keystore: str | None = None) -> ssl.SSLContext:
    """For our own connections to a TLS listener (verifying the broker against ``truststore``)."""
    context = ssl.create_default_context(cafile=truststore)
    if keystore:
        context.load_cert_chain(keystore)
    return context


def internal_client_context(config: BrokerConfig) -> ssl.SSLContext | None:
    """For brokers' and the WAL manager's own connections: TLS when the inter-broker listener's
    protocol is SSL or SASL_SSL, verified against ``ssl.truststore.location`` (else system CAs)."""
    if not config.security_protocol(config.inter_broker_listener).endswith("SSL"):
        return None
    return client_context(config.ssl_truststore_location)


def principal_of(peercert: dict[str, Any] | None) -> str:
    """``User:CN=alice,O=example`` for a verified client certificate, else ANONYMOUS."""
    if not peercert or not peercert.get("subject"):
        return ANONYMOUS
    rdns = ["+".join(f"{_SHORT.get(key, key)}={_escape(value)}" for key, value in rdn) for rdn in peercert["subject"]]
    return "User:" + ",".join(reversed(rdns))  # RFC 2253: most specific first


_SHORT = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "stateOrProvinceName": "ST",
    "localityName": "L",
    "domainComponent": "DC",
}


def _escape(value: str) -> str:
    out = "".join("\\" + ch if ch in ',+"\\<>;=' else ch for ch in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    return out[:-1] + "\\ " if out.endswith(" ") else out


@dataclass(frozen=True)
class DevCerts:
    ca: Path  # the CA certificate: clients' truststore / ssl.ca.location
    keystore: Path  # broker certificate + key (ssl.keystore.location)
    ca_key: Path  # the CA's private key (mode 600): issue_client_cert signs with it


def make_dev_certs(directory: Path, hosts: list[str], days: int = 30) -> DevCerts:
    """A new local CA and a broker certificate signed by it, valid for ``hosts`` (names or IPs)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "diskless dev CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys([*hosts, "localhost", "127.0.0.1"]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "diskless broker")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_path = directory / "ca.pem"
    ca_path.write_bytes(ca_cert.public_bytes(pem))
    keystore = directory / "broker.pem"
    keystore.write_bytes(
        cert.public_bytes(pem)
        + ca_cert.public_bytes(pem)
        + key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    keystore.chmod(0o600)
    ca_key_path = directory / "ca-key.pem"
    ca_key_path.write_bytes(ca_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    ca_key_path.chmod(0o600)
    return DevCerts(ca_path, keystore, ca_key_path)


def issue_client_cert(certs: DevCerts, common_name: str, days: int = 30) -> tuple[Path, Path]:
    """A client certificate ``CN=<common_name>`` from the development CA: (certificate, key) PEM
    files beside it, for ``ssl.client.auth`` listeners (its principal: ``User:CN=<common_name>``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate(certs.ca.read_bytes())
    ca_key = serialization.load_pem_private_key(certs.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    cert_path = certs.ca.parent / f"client-{common_name}.pem"
    key_path = certs.ca.parent / f"client-{common_name}-key.pem"
    cert_path.write_bytes(cert.public_bytes(pem))
    key_path.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path
