"""The `--command-config client.properties` parser: Java client properties (Kafka's tools) → kafka-python kwargs.
Pure text parsing; a setting that would silently connect differently under kafka-python is refused with what to
use instead, and OAUTHBEARER settings become `sasl_oauth_*` strings for common/oauth.py. What is accepted:
docs/security.md, sections 4 and 7.
"""

from __future__ import annotations

import re

from detectors.models import Model

ClientValue = str | int | bool


class ClientPropertiesError(ValueError):
    """A client.properties setting kafka-python cannot honour; the message says what to do instead."""


class ParsedClientProperties(Model):
    """kafka-python kwargs from a client.properties file, plus the keys that were left out and why."""

    kwargs: dict[str, ClientValue]
    ignored: tuple[str, ...] = ()


# Java client property → kafka-python kwarg, for settings whose value can be passed as is.
_DIRECT: dict[str, str] = {
    "bootstrap.servers": "bootstrap_servers",
    "client.id": "client_id",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.kerberos.service.name": "sasl_kerberos_service_name",
    "ssl.key.password": "ssl_password",
    "ssl.cipher.suites": "ssl_ciphers",
    "request.timeout.ms": "request_timeout_ms",
    "retry.backoff.ms": "retry_backoff_ms",
    "reconnect.backoff.ms": "reconnect_backoff_ms",
    "reconnect.backoff.max.ms": "reconnect_backoff_max_ms",
    "connections.max.idle.ms": "connections_max_idle_ms",
    "metadata.max.age.ms": "metadata_max_age_ms",
    "receive.buffer.bytes": "receive_buffer_bytes",
    "send.buffer.bytes": "send_buffer_bytes",
    "default.api.timeout.ms": "default_api_timeout_ms",
    "client.dns.lookup": "client_dns_lookup",
    # OAUTHBEARER with the client-credentials grant (Kafka 4.1+ names; clientId/clientSecret/scope in the JAAS
    # options of OAuthBearerLoginModule are the older spelling): common/oauth.py.
    "sasl.oauthbearer.token.endpoint.url": "sasl_oauth_token_endpoint_url",
    "sasl.oauthbearer.client.credentials.client.id": "sasl_oauth_client_id",
    "sasl.oauthbearer.client.credentials.client.secret": "sasl_oauth_client_secret",
    "sasl.oauthbearer.scope": "sasl_oauth_scope",
    # Not Java client properties: PEM files for kafka-python, accepted so one file serves both tools.
    "ssl.cafile": "ssl_cafile",
    "ssl.certfile": "ssl_certfile",
    "ssl.keyfile": "ssl_keyfile",
    "ssl.crlfile": "ssl_crlfile",
}
# Settings kafka-python has no equivalent for but that are harmless to drop.
_HARMLESS = frozenset(
    {
        "ssl.protocol",
        "ssl.enabled.protocols",
        "ssl.keymanager.algorithm",
        "ssl.trustmanager.algorithm",
        "ssl.secure.random.implementation",
        "sasl.login.class",
        "sasl.client.callback.handler.class",
        # Java's token refresh and the broker-side OAUTHBEARER settings: common/oauth.py renews on its own.
        "sasl.login.refresh.window.factor",
        "sasl.login.refresh.window.jitter",
        "sasl.login.refresh.min.period.seconds",
        "sasl.login.refresh.buffer.seconds",
        "sasl.login.connect.timeout.ms",
        "sasl.login.read.timeout.ms",
        "sasl.login.retry.backoff.ms",
        "sasl.login.retry.backoff.max.ms",
        "security.providers",
        "ssl.engine.factory.class",
    }
)
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# sasl.login.callback.handler.class values whose token kafka-python can get the same way (common/oauth.py).
_KAFKA_OAUTH_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
_MSK_OAUTH_HANDLER = "software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler"
# The JAAS options of OAuthBearerLoginModule that choose the token: unsecured claims, or client credentials.
_OAUTH_JAAS_OPTIONS = {
    "unsecuredLoginStringClaim_sub": "sasl_oauth_unsecured_sub",
    "unsecuredLoginLifetimeSeconds": "sasl_oauth_unsecured_lifetime_s",
    "clientId": "sasl_oauth_client_id",
    "clientSecret": "sasl_oauth_client_secret",
    "scope": "sasl_oauth_scope",
}
# Where a token comes from; an OAUTHBEARER file without one of them would not authenticate under kafka-python.
_OAUTH_SOURCES = ("sasl_oauth_token_endpoint_url", "sasl_oauth_unsecured_sub", "sasl_oauth_aws_msk_iam")
# The SASL mechanisms kafka-python 3.0 implements (kafka.net.sasl); any other fails only at the first connection.
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER", "AWS_MSK_IAM")
_JAAS_ENTRY = re.compile(
    r"^\s*(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)\s*(?P<options>.*?)\s*;?\s*$",
    re.S,
)
_JAAS_OPTION = re.compile(
    r'\s*(?P<key>[\w.-]+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s;"]+))', re.S
)


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java `.properties` text: `key=value`, `key: value` or `key value`; `#`/`!` comments; a trailing
    backslash continues a line; `\\t \\n \\r \\f \\uXXXX` and escaped separators are unescaped.

    Raises:
        ClientPropertiesError: a malformed `\\uXXXX` escape (as Java's `Properties.load`).
    """
    out: dict[str, str] = {}
    logical: list[str] = []
    for raw in text.splitlines():
        line = raw.lstrip(" \t\f")
        if not logical and (not line or line[0] in "#!"):
            continue
        if (len(line) - len(line.rstrip("\\"))) % 2 == 1:
            logical.append(line[:-1])  # an odd number of trailing backslashes: the line continues
            continue
        logical.append(line)
        key, value = _split_property("".join(logical))
        logical = []
        out[key] = value
    if logical:
        key, value = _split_property("".join(logical))
        out[key] = value
    return out


def _split_property(line: str) -> tuple[str, str]:
    # The key ends at the first unescaped '=', ':' or blank; one '=' or ':' between blanks may follow.
    i, n = 0, len(line)
    while i < n and line[i] not in "=: \t\f":
        i += 2 if line[i] == "\\" else 1
    key = line[: min(i, n)]
    j = i
    while j < n and line[j] in " \t\f":
        j += 1
    if j < n and line[j] in "=:":
        j += 1
        while j < n and line[j] in " \t\f":
            j += 1
    return _unescape(key), _unescape(line[j:])


def _unescape(s: str) -> str:
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        ch = s[i]
        if ch != "\\" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = s[i + 1]
        if nxt == "u":
            digits = s[i + 2 : i + 6]
            if len(digits) < 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                # Java's Properties.load refuses it too ("Malformed \\uxxxx encoding")
                raise ClientPropertiesError(f"malformed \\uxxxx escape {s[i : i + 6]!r}")
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append({"t": "\t", "n": "\n", "r": "\r", "f": "\f"}.get(nxt, nxt))
        i += 2
    return "".join(out)


def parse_jaas_config(value: str) -> tuple[str, dict[str, str]]:
    """Split a `sasl.jaas.config` value into (login module class, options).

    Raises:
        ClientPropertiesError: if the value is not one `<module> <flag> key=value ...;` entry.
    """
    m = _JAAS_ENTRY.match(value)
    if not m:
        raise ClientPropertiesError(f"sasl.jaas.config: cannot parse {value!r}")
    options: dict[str, str] = {}
    rest = m.group("options")
    pos = 0
    while pos < len(rest) and rest[pos:].strip():
        om = _JAAS_OPTION.match(rest, pos)
        if not om:
            raise ClientPropertiesError(f"sasl.jaas.config: cannot parse options {rest[pos:]!r}")
        quoted = om.group("quoted")
        value = om.group("bare") if quoted is None else re.sub(r"\\(.)", r"\1", quoted)
        options[om.group("key")] = value
        pos = om.end()
    return m.group("module"), options


def parse_client_properties(text: str) -> ParsedClientProperties:
    """Translate a Kafka `client.properties` file (`--command-config` of Kafka tools) to kafka-python kwargs.

    Handles security.protocol, sasl.mechanism, sasl.jaas.config (PLAIN and SCRAM → sasl_plain_username /
    sasl_plain_password; Kerberos → service name; OAuthBearerLoginModule → sasl_oauth_* settings; Amazon MSK's
    IAMLoginModule), the OAUTHBEARER client-credentials properties, PEM trust and key stores,
    ssl.endpoint.identification.algorithm (→ ssl_check_hostname) and common timeouts; kafka-python's own
    `ssl.cafile` / `ssl.certfile` / `ssl.keyfile` are accepted too. Keys it cannot use are in `ignored`.

    Args:
        text: the file's content.

    Returns:
        The kwargs and the ignored keys.

    Raises:
        ClientPropertiesError: for settings that would silently connect differently under kafka-python, with
            what to use instead: JKS/PKCS12 stores (give PEM files: ssl.truststore.type=PEM or ssl.cafile),
            inline PEM certificates, OAUTHBEARER without a token source kafka-python can use, an unknown
            security.protocol or sasl.mechanism, a malformed `\\uXXXX` escape.
    """
    props = parse_properties(text)
    kwargs: dict[str, ClientValue] = {}
    ignored: list[str] = []
    for key, value in props.items():
        if key in _DIRECT:
            kwargs[_DIRECT[key]] = coerce_value(value) if key.endswith((".ms", ".bytes")) else value
            if key.endswith((".ms", ".bytes")) and type(kwargs[_DIRECT[key]]) is not int:
                raise ClientPropertiesError(f"{key}: {value!r} is not a whole number")
        elif key == "sasl.jaas.config":
            kwargs.update(_jaas_kwargs(value, ignored))
        elif key == "ssl.endpoint.identification.algorithm":
            kwargs["ssl_check_hostname"] = value.strip().lower() == "https"
        elif key in ("ssl.truststore.location", "ssl.keystore.location"):
            kwargs.update(_store_kwargs(key, value, props))
        elif key in ("ssl.truststore.type", "ssl.keystore.type", "ssl.truststore.password"):
            continue  # consumed with the store location
        elif key == "ssl.keystore.password":
            if props.get("ssl.keystore.type", "JKS").upper() != "PEM":
                continue  # the store itself is rejected with the location
            ignored.append(f"{key}: a PEM key store has no store password (use ssl.key.password)")
        elif key in ("ssl.truststore.certificates", "ssl.keystore.certificate.chain", "ssl.keystore.key"):
            store = "truststore" if "truststore" in key else "keystore"
            raise ClientPropertiesError(
                f"{key}: kafka-python cannot take inline PEM; write it to a file and set "
                f"ssl.{store}.location with ssl.{store}.type=PEM"
            )
        elif key == "sasl.login.callback.handler.class":
            kwargs.update(_login_handler_kwargs(value, ignored))
        elif key in _HARMLESS:
            ignored.append(f"{key}: no kafka-python equivalent (dropped)")
        else:
            ignored.append(f"{key}: unknown to txnwatch (dropped)")
    protocol = kwargs.get("security_protocol")
    if protocol is not None and protocol not in _PROTOCOLS:
        raise ClientPropertiesError(f"security.protocol: {protocol!r} is not one of {', '.join(_PROTOCOLS)}")
    mechanism = kwargs.get("sasl_mechanism")
    if mechanism is not None and mechanism not in _MECHANISMS:
        raise ClientPropertiesError(f"sasl.mechanism: {mechanism!r} is not one of {', '.join(_MECHANISMS)}")
    oauth_login = "OAuthBearerLoginModule" in props.get("sasl.jaas.config", "")
    if (mechanism == "OAUTHBEARER" or oauth_login) and not any(kwargs.get(k) for k in _OAUTH_SOURCES):
        raise ClientPropertiesError(
            "sasl.mechanism=OAUTHBEARER: no token source kafka-python can use: give "
            "sasl.oauthbearer.token.endpoint.url with sasl.oauthbearer.client.credentials.client.id / .client.secret "
            "(the client-credentials grant), sasl.login.callback.handler.class="
            f"{_MSK_OAUTH_HANDLER} (Amazon MSK IAM), or, for a broker on Kafka's unsecured validator, "
            'sasl.jaas.config=...OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="<principal>";'
        )
    return ParsedClientProperties(kwargs=kwargs, ignored=tuple(ignored))


def _login_handler_kwargs(value: str, ignored: list[str]) -> dict[str, ClientValue]:
    handler = value.strip()
    if handler == _MSK_OAUTH_HANDLER:
        # The region comes from the settings or AWS_REGION (common/oauth.py), the credentials from boto's chain.
        return {"sasl_oauth_aws_msk_iam": True}
    if (
        handler != _KAFKA_OAUTH_HANDLER
    ):  # Kafka's own needs sasl.oauthbearer.token.endpoint.url, checked above
        ignored.append(
            f"sasl.login.callback.handler.class: {handler} has no kafka-python equivalent (dropped; txnwatch "
            "reproduces Kafka's client-credentials login and Amazon MSK's IAM login only)"
        )
    return {}


def _jaas_kwargs(value: str, ignored: list[str]) -> dict[str, ClientValue]:
    module, options = parse_jaas_config(value)
    short = module.rsplit(".", 1)[-1]
    if short in ("PlainLoginModule", "ScramLoginModule"):
        missing = [k for k in ("username", "password") if k not in options]
        if missing:
            raise ClientPropertiesError(f"sasl.jaas.config: {short} without {' and '.join(missing)}")
        return {"sasl_plain_username": options["username"], "sasl_plain_password": options["password"]}
    if short == "Krb5LoginModule":
        out: dict[str, ClientValue] = {}
        if "serviceName" in options:
            out["sasl_kerberos_service_name"] = options["serviceName"]
        for opt in sorted(set(options) - {"serviceName"}):
            ignored.append(f"sasl.jaas.config {opt}: kafka-python uses the Kerberos ticket cache (run kinit)")
        return out
    if short == "OAuthBearerLoginModule":
        oauth: dict[str, ClientValue] = {}
        for opt, raw in options.items():
            if opt in _OAUTH_JAAS_OPTIONS:
                oauth[_OAUTH_JAAS_OPTIONS[opt]] = coerce_value(raw) if opt.endswith("Seconds") else raw
            else:
                ignored.append(f"sasl.jaas.config {opt}: not used by txnwatch's OAUTHBEARER login (dropped)")
        return oauth
    if short == "IAMLoginModule":
        # Amazon MSK IAM (sasl.mechanism=AWS_MSK_IAM): kafka-python signs with botocore's default credentials.
        for opt in sorted(options):
            hint = "set AWS_PROFILE instead" if opt == "awsProfileName" else "dropped"
            ignored.append(f"sasl.jaas.config {opt}: kafka-python uses botocore's credential chain ({hint})")
        return {}
    raise ClientPropertiesError(f"sasl.jaas.config: unsupported login module {module}")


def _store_kwargs(key: str, location: str, props: dict[str, str]) -> dict[str, ClientValue]:
    trust = key == "ssl.truststore.location"
    type_key = "ssl.truststore.type" if trust else "ssl.keystore.type"
    store_type = props.get(type_key)
    if store_type is None:
        # Java's default is JKS; accept a PEM file recognised by its extension.
        store_type = "PEM" if location.lower().endswith((".pem", ".crt", ".cer")) else "JKS"
    if store_type.upper() != "PEM":
        if trust:
            raise ClientPropertiesError(
                f"ssl.truststore.location {location!r} is a {store_type} store, which kafka-python cannot "
                "read: export the CA certificate as PEM (keytool -exportcert -rfc -alias <ca> -keystore "
                "<store>) and give that file as ssl.cafile (in this file, or TXNWATCH_KAFKA__SSL_CAFILE), "
                "or set ssl.truststore.location to it with ssl.truststore.type=PEM"
            )
        raise ClientPropertiesError(
            f"ssl.keystore.location {location!r} is a {store_type} store, which kafka-python cannot read: "
            "convert it to PEM (openssl pkcs12 -in <p12> -out client.pem) and give ssl.certfile and "
            "ssl.keyfile (in this file, or TXNWATCH_KAFKA__SSL_CERTFILE / __SSL_KEYFILE), or set "
            "ssl.keystore.location to it with ssl.keystore.type=PEM"
        )
    # A PEM key store holds the certificate chain and the private key; Python's load_cert_chain reads both.
    return {"ssl_cafile": location} if trust else {"ssl_certfile": location}


def coerce_value(raw: str) -> ClientValue:
    """A property value as kafka-python wants it: "123" → 123, "true"/"false" → bool, anything else unchanged."""
    s = raw.strip()
    if re.fullmatch(r"-?\d+", s):
        return int(s)
    if s.lower() in ("true", "false"):
        return s.lower() == "true"
    return raw
