"""Certificates and OAUTHBEARER login settings for the test bed's TLS and OAuth modes (dev/kafka.py `security=`).

Made at every `up`, under `<state dir>/tls/`: a CA (`ca.pem`), a broker certificate for 127.0.0.1 and localhost
(`broker.pem`) and one client certificate per principal (`<name>.pem`, CN=<name>: the mTLS bed maps the subject
to `User:<name>` with `ssl.principal.mapping.rules`). Every key file holds the PKCS#8 private key (`BEGIN PRIVATE
KEY`: the form Kafka's Java PEM key store reads) followed by its certificate, so one file serves as
`ssl.keystore.location` with `ssl.keystore.type=PEM` for the JVMs and as kafka-python's `ssl_certfile`.

Uses `cryptography` (a dev extra in pyproject.toml); nothing here runs in production.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# A test bed lives for minutes; a day of validity leaves room for clock skew and long debugging sessions.
VALIDITY = datetime.timedelta(days=1)
# Kafka's unsecured OAUTHBEARER login module and its default validator (Kafka's SaslChannelBuilder uses
# OAuthBearerUnsecuredLoginCallbackHandler / OAuthBearerUnsecuredValidatorCallbackHandler when no handler class is
# configured): the token is an unsigned JWS whose `sub` claim is the principal.
OAUTH_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"

# The test bed's modes with TLS on the client listener (dev/kafka.py TestBedConfig.security):
# "ssl": TLS, server authentication only; every client is ANONYMOUS, so no authorizer.
# "mtls": TLS with ssl.client.auth=required; the certificate's CN is the principal; StandardAuthorizer.
# "sasl-ssl-scram": SASL_SSL with SCRAM-SHA-256; StandardAuthorizer.
# "sasl-oauthbearer": SASL_SSL with OAUTHBEARER, Kafka's unsecured JWS login and validator (the token's `sub`
#   is the principal); StandardAuthorizer.
TlsMode = Literal["ssl", "mtls", "sasl-ssl-scram", "sasl-oauthbearer"]
TLS_MODES: tuple[TlsMode, ...] = ("ssl", "mtls", "sasl-ssl-scram", "sasl-oauthbearer")


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files of one test bed: the CA, the broker's key and certificate, one key file per principal."""

    ca: Path
    broker: Path
    clients: dict[str, Path]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_private(path: Path, data: bytes) -> None:
    # Keys are secrets even on a test bed: mode 0600, like the client.properties holding passwords.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_and_cert_pem(key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> bytes:
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem + cert.public_bytes(serialization.Encoding.PEM)


def _issue(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    common_name: str,
    *,
    server: bool,
    now: datetime.datetime,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # The broker's certificate also authenticates it as a client (inter-broker on the same listener).
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                if server
                else [ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    if server:
        # Clients verify the host name (Java's ssl.endpoint.identification.algorithm=https, kafka-python's
        # ssl_check_hostname): the bed listens on 127.0.0.1.
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
    return key, builder.sign(ca_key, hashes.SHA256())


def make_tls_files(directory: Path, broker_name: str, clients: tuple[str, ...]) -> TlsFiles:
    """A new CA, the broker's key file (CN=`broker_name`) and one client key file per name in `clients`."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("txnwatch test bed CA"))
        .issuer_name(_name("txnwatch test bed CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca = directory / "ca.pem"
    ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    broker = directory / "broker.pem"
    _write_private(broker, _key_and_cert_pem(*_issue(ca_key, ca_cert, broker_name, server=True, now=now)))
    paths: dict[str, Path] = {}
    for name in clients:
        paths[name] = directory / f"{name}.pem"
        _write_private(paths[name], _key_and_cert_pem(*_issue(ca_key, ca_cert, name, server=False, now=now)))
    return TlsFiles(ca, broker, paths)


def oauth_jaas(principal: str) -> str:
    """`sasl.jaas.config` of Kafka's unsecured OAUTHBEARER login: a token whose `sub` (the principal) is
    `principal`."""
    return f'{OAUTH_LOGIN_MODULE} required unsecuredLoginStringClaim_sub="{principal}";'


def ssl_client_properties(files: TlsFiles, name: str | None) -> str:
    """client.properties lines for TLS: trust the bed's CA; with `name`, present that principal's certificate."""
    lines = [
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={files.ca}",
    ]
    if name is not None:
        lines += ["ssl.keystore.type=PEM", f"ssl.keystore.location={files.clients[name]}"]
    return "".join(f"{line}\n" for line in lines)


def ssl_broker_properties(files: TlsFiles, *, client_auth: bool) -> dict[str, str]:
    """The broker's TLS settings (PEM key and trust stores); `client_auth`: every client must present a
    certificate of the bed's CA, and its subject CN is its principal."""
    props = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.broker),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca),
    }
    if client_auth:
        props["ssl.client.auth"] = "required"
        # CN=txnwatch-collector → User:txnwatch-collector, so the ACL lines of docs/security.md apply as written.
        props["ssl.principal.mapping.rules"] = "RULE:^CN=([^,]+)$/$1/,DEFAULT"
    return props


def _protocol(mode: TlsMode) -> str:
    return "SSL" if mode in ("ssl", "mtls") else "SASL_SSL"


def broker_properties(
    mode: TlsMode,
    files: TlsFiles,
    broker_port: int,
    controller_port: int,
    *,
    super_user: str,
    scram_jaas: str,
    scram_mechanism: str,
) -> dict[str, str]:
    """The listener, TLS, SASL and authorizer settings of one node in `mode`. Brokers talk to each other on the
    client listener as `super_user` (its certificate, SCRAM user or token subject); the controller listener stays
    PLAINTEXT on loopback (its principal ANONYMOUS, a super user), as on the SASL_PLAINTEXT bed."""
    protocol = _protocol(mode)
    listener = protocol.lower()
    props = {
        "listeners": f"{protocol}://127.0.0.1:{broker_port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"{protocol}://127.0.0.1:{broker_port}",
        "inter.broker.listener.name": protocol,
        "listener.security.protocol.map": f"CONTROLLER:PLAINTEXT,{protocol}:{protocol}",
        **ssl_broker_properties(files, client_auth=mode == "mtls"),
    }
    if mode == "sasl-ssl-scram":
        props |= {
            "sasl.enabled.mechanisms": scram_mechanism,
            "sasl.mechanism.inter.broker.protocol": scram_mechanism,
            f"listener.name.{listener}.{scram_mechanism.lower()}.sasl.jaas.config": scram_jaas,
        }
    if mode == "sasl-oauthbearer":
        # No server callback handler configured: Kafka validates with OAuthBearerUnsecuredValidatorCallbackHandler.
        props |= {
            "sasl.enabled.mechanisms": "OAUTHBEARER",
            "sasl.mechanism.inter.broker.protocol": "OAUTHBEARER",
            f"listener.name.{listener}.oauthbearer.sasl.jaas.config": oauth_jaas(super_user),
        }
    if mode != "ssl":
        props |= {
            "authorizer.class.name": AUTHORIZER,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{super_user};User:ANONYMOUS",
        }
    return props


def client_properties_text(
    mode: TlsMode, bootstrap: str, files: TlsFiles, user: str, *, scram_jaas: str, scram_mechanism: str
) -> str:
    """`user`'s client.properties on a `mode` bed, in Kafka's Java client names (Spark reads it as is; txnwatch
    translates it for kafka-python)."""
    lines = [
        f"# {user} on the txnwatch {mode} test bed (dev/kafka.py, dev/tls.py); its ACLs: docs/security.md",
        f"bootstrap.servers={bootstrap}",
        f"security.protocol={_protocol(mode)}",
    ]
    if mode == "sasl-ssl-scram":
        lines += [f"sasl.mechanism={scram_mechanism}", f"sasl.jaas.config={scram_jaas}"]
    if mode == "sasl-oauthbearer":
        lines += ["sasl.mechanism=OAUTHBEARER", f"sasl.jaas.config={oauth_jaas(user)}"]
    text = "".join(f"{line}\n" for line in lines)
    return text + ssl_client_properties(files, user if mode == "mtls" else None)
