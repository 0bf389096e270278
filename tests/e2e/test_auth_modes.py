"""Authentication against real TLS brokers: TLS (server authentication), mutual TLS and SASL/OAUTHBEARER.

One test bed per mode (dev/kafka.py `security=`, certificates made at start by dev/tls.py), each component with its
own `client.properties` from `<state dir>/clients/` through `--command-config`, exactly as an operator would:
- "ssl": SSL, the broker's certificate checked against the bed's CA (host name 127.0.0.1 in its SAN); no
  client identity, so no authorizer;
- "mtls": SSL with `ssl.client.auth=required`; each component presents its own certificate, whose CN is its
  principal (`ssl.principal.mapping.rules`), and has exactly the ACLs docs/security.md lists;
- "sasl-oauthbearer": SASL_SSL with OAUTHBEARER, Kafka's unsecured JWS login and validator: kafka-python gets its
  token from common/oauth.py, Spark's Java client from the JAAS line; the token's `sub` is the principal, with
  the documented ACLs.
In each: a real orphan (dev/workload.py's `hanging` as the `workload` principal); `collect --once` sees it; the
collector and the real streaming job (Spark's Kafka source reads the snapshots and `__transaction_state`, its sink
writes the candidate) propose it; `proposals abort --execute` aborts it as the abort principal. The OAUTHBEARER
bed also authenticates kafka-python with a token from a real client-credentials endpoint (a local HTTP server).
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.admin import (
    ACL,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
    ResourceType,
)
from kafka.errors import KafkaError
from test_security_acls import (  # the SASL bed's helpers: documented ACLs, the orphan, running txnwatch
    ROOT,
    Orphan,
    Secure,
    _stop,
    documented_lines,
    free_port,
    grant,
    make_orphan,
    parse_acl_line,
    read_all,
    stream_command,
)

import dev.kafka as testbed
from common.oauth import ClientCredentialsTokenProvider, unsecured_jws
from detectors.models import AbortCandidate

pytestmark = pytest.mark.e2e

# Each mode is a bed, a job and an abort (2.5-3 minutes): all three run in `make compat`, beside the releases'
# matrix; `make test` keeps SASL/SCRAM with least-privilege ACLs (tests/e2e/test_security_acls.py).
MODES = (
    pytest.param("ssl", marks=pytest.mark.compat),
    pytest.param("mtls", marks=pytest.mark.compat),
    pytest.param("sasl-oauthbearer", marks=pytest.mark.compat),
)
PROPOSE_TIMEOUT_S = 240.0


def _workload_acls(watched: str) -> list[ACL]:
    return [
        ACL(
            "User:workload",
            "*",
            op,
            ACLPermissionType.ALLOW,
            ResourcePattern(rtype, watched, ACLResourcePatternType.PREFIXED),
        )
        for rtype, ops in (
            (ResourceType.TOPIC, (ACLOperation.CREATE, ACLOperation.WRITE, ACLOperation.DESCRIBE)),
            (ResourceType.TRANSACTIONAL_ID, (ACLOperation.WRITE, ACLOperation.DESCRIBE)),
        )
        for op in ops
    ]


@pytest.fixture(scope="module", params=MODES)
def bed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    """A one-node bed in the mode, with the documented ACLs granted where the mode has principals."""
    mode: str = request.param
    state = tmp_path_factory.mktemp(f"{mode}-testbed")
    cluster = testbed.start_cluster(testbed.TestBedConfig(security=mode, partition_verification=False), state)  # type: ignore[arg-type]
    admin: KafkaAdminClient | None = None
    try:
        tag = uuid.uuid4().hex[:8]
        prefix, watched = f"auth{tag}", f"wl{tag}-"
        admin = KafkaAdminClient(**cluster.client_kwargs())
        documented = [
            a for line in documented_lines() for a in parse_acl_line(line, prefix=prefix, watched=watched)
        ]
        if mode != "ssl":  # TLS without client certificates: every client is ANONYMOUS, no authorizer
            grant(admin, documented + _workload_acls(watched))
        yield Secure(cluster, prefix, watched, documented, admin, [], tmp_path_factory.mktemp(f"{mode}-work"))
    finally:
        if admin is not None:
            admin.close()
        testbed.stop_cluster(state)


def _mode(bed: Secure) -> str:
    return str(bed.cluster.config["security"])


def test_each_component_authenticates_as_its_own_principal(bed: Secure) -> None:
    """The files say what an operator would write (Kafka's names), and the broker sees who they say."""
    expected_protocol = "SSL" if _mode(bed) in ("ssl", "mtls") else "SASL_SSL"
    for user in ("txnwatch-collector", "txnwatch-stream", "txnwatch-abort"):
        text = bed.config(user).read_text()
        assert f"security.protocol={expected_protocol}" in text and "ssl.truststore.location=" in text
    if _mode(bed) == "ssl":
        return
    done = bed.txnwatch("txnwatch-collector", "collect", "--once", "--log-level", "DEBUG")
    assert done.returncode == 0, done.stderr[-3000:]
    # Denied nothing it is documented to need; what the broker authorized was the collector's principal.
    log = Path(bed.cluster.nodes[0].log_file).read_text()
    assert "Principal = User:txnwatch-collector is Denied" not in log, log[-3000:]


def test_collector_sees_a_real_orphan(bed: Secure) -> None:
    orphan = _orphan(bed)
    done = bed.txnwatch("txnwatch-collector", "collect", "--once", "--publish", "--output", "json")
    assert done.returncode == 0, done.stderr[-3000:]
    sweep = json.loads(done.stdout)
    assert sweep["problems"] == [], sweep["problems"]
    (snap,) = [s for s in sweep["snapshots"] if s["topic"] == orphan.topic]
    (txn,) = snap["open_transactions"]
    assert (txn["producer_id"], txn["start_offset"]) == (orphan.producer_id, orphan.start_offset)
    (position,) = sweep["coordinator_log_positions"]
    assert position["end_offsets"]


_ORPHANS: dict[str, Orphan] = {}


def _orphan(bed: Secure) -> Orphan:
    if bed.prefix not in _ORPHANS:
        _ORPHANS[bed.prefix] = make_orphan(bed, "hang")
    return _ORPHANS[bed.prefix]


def _propose(bed: Secure, orphan: Orphan) -> tuple[AbortCandidate, str]:
    """The collector and the real streaming job, each with its own client.properties, until the job proposes the
    orphan; returns the candidate and the job's console."""
    collector_out, job_out = bed.work / "collector.log", bed.work / "stream.log"
    with collector_out.open("wb") as cout, job_out.open("wb") as jout:
        collector = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "txnwatch_cli",
                "collect",
                *bed.args("txnwatch-collector"),
                "--interval",
                "2",
                "--metrics-port",
                "0",
            ],
            stdout=cout,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=bed.env(),
            start_new_session=True,
        )
        stream = subprocess.Popen(
            stream_command(bed, free_port(), bed.work / "checkpoints", PROPOSE_TIMEOUT_S + 60),
            stdout=jout,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=bed.env(),
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + PROPOSE_TIMEOUT_S
            found: list[AbortCandidate] = []
            while not found:
                assert stream.poll() is None, job_out.read_text()[-4000:]
                assert collector.poll() is None, collector_out.read_text()[-4000:]
                assert time.monotonic() < deadline, job_out.read_text()[-4000:]
                time.sleep(3)
                found = [
                    c
                    for c in (
                        AbortCandidate.model_validate_json(r.value)
                        for r in read_all(bed, f"{bed.prefix}.abort-candidates")
                    )
                    if c.topic == orphan.topic and c.status.value == "OPENED"
                ]
            # Stopped once every query runs (the console then says where the metrics are): a SIGINT while the
            # job still starts its queries ends it with a KeyboardInterrupt traceback, not a clean stop.
            while "metrics on http://" not in job_out.read_text():
                assert time.monotonic() < deadline + 60, job_out.read_text()[-4000:]
                time.sleep(1)
        finally:
            _stop(stream, signal.SIGINT, 60)
            _stop(collector, signal.SIGTERM, 30)
    return found[0], job_out.read_text()


def test_stream_proposes_and_abort_aborts_the_orphan(bed: Secure) -> None:
    orphan = _orphan(bed)
    started = time.monotonic()
    candidate, console = _propose(bed, orphan)
    print(f"\n{_mode(bed)}: proposed in {time.monotonic() - started:.0f} s")
    assert (candidate.spec.producer_id, candidate.start_offset) == (orphan.producer_id, orphan.start_offset)
    assert candidate.reason.value == "coordinator-completed"
    at = console.find("Traceback")
    assert at < 0, console[max(0, at - 500) : at + 4000]
    done = bed.txnwatch(
        "txnwatch-abort",
        "proposals",
        "abort",
        candidate.candidate_id,
        "--execute",
        "--actor",
        "on-call",
        "--output",
        "json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["outcome"] == "ABORTED", done.stdout
    report = bed.txnwatch(
        "txnwatch-admin" if _mode(bed) != "ssl" else "txnwatch-abort",
        "inspect",
        "partition",
        "--topic",
        orphan.topic,
        "--partition",
        "0",
        "--output",
        "json",
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert json.loads(report.stdout)["open_transactions"] == []


# ------------------------------------------------------------------ OAUTHBEARER: the client-credentials grant


class _TokenEndpoint(BaseHTTPRequestHandler):
    """An OAuth token endpoint for one client: it checks the client-credentials request and answers with
    Kafka's unsecured JWS for the client's id (the bed validates with Kafka's unsecured validator)."""

    client_id = "txnwatch-admin"
    client_secret = "endpoint-secret"
    requests: list[dict[str, Any]] = []  # noqa: RUF012  # shared with the test

    def do_POST(self) -> None:
        body = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
        auth = self.headers.get("Authorization", "")
        expected = "Basic " + base64.b64encode(f"{self.client_id}:{self.client_secret}".encode()).decode()
        type(self).requests.append({"body": body, "authorized": auth == expected})
        if auth != expected or body.get("grant_type") != ["client_credentials"]:
            self.send_response(401)
            self.end_headers()
            return
        answer = {"access_token": unsecured_jws(self.client_id, time.time(), 300), "expires_in": 300}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return


@pytest.mark.compat
@pytest.mark.parametrize("bed", ["sasl-oauthbearer"], indirect=True)
def test_oauthbearer_client_credentials_token_from_a_real_endpoint(bed: Secure, tmp_path: Path) -> None:
    server = HTTPServer(("127.0.0.1", 0), _TokenEndpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/oauth2/token"
        config = tmp_path / "admin-cc.properties"
        text = (
            bed.config("txnwatch-admin")
            .read_text()
            .replace('unsecuredLoginStringClaim_sub="txnwatch-admin"', "")
        )
        config.write_text(
            text
            + f"sasl.oauthbearer.token.endpoint.url={url}\n"
            + "sasl.oauthbearer.client.credentials.client.id=txnwatch-admin\n"
            + "sasl.oauthbearer.client.credentials.client.secret=endpoint-secret\n"
        )
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "txnwatch_cli",
                "inspect",
                "coordinator-log",
                "--from-beginning",
                "--timeout-ms",
                "3000",
                "--output",
                "json",
                "--bootstrap-server",
                bed.cluster.bootstrap_servers,
                "--command-config",
                str(config),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=ROOT,
            env=bed.env(),
        )
        assert done.returncode == 0, done.stderr[-3000:]
        # It read the transaction log as txnwatch-admin (Read on __transaction_state is granted to it alone).
        assert [json.loads(line)["state"] for line in done.stdout.splitlines()], done.stderr[-3000:]
        assert "endpoint-secret" not in done.stdout + done.stderr
        assert _TokenEndpoint.requests and all(r["authorized"] for r in _TokenEndpoint.requests)
        # A wrong secret: the endpoint refuses, and so no connection authenticates.
        wrong = ClientCredentialsTokenProvider(url, "txnwatch-admin", "wrong")
        with pytest.raises((KafkaError, RuntimeError)):
            KafkaAdminClient(
                bootstrap_servers=bed.cluster.bootstrap_servers,
                security_protocol="SASL_SSL",
                sasl_mechanism="OAUTHBEARER",
                sasl_oauth_token_provider=wrong,
                ssl_cafile=str(Path(bed.cluster.state_dir) / "tls" / "ca.pem"),
                bootstrap_timeout_ms=5000,
            )
    finally:
        server.shutdown()
        server.server_close()
