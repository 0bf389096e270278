"""The container images, run as a user runs them: both components and the abort from the images, not from .venv.

dev/image.py builds both targets (`make image`; skipped when the inputs did not change) and runs them with
`buildah run` (no Docker engine here): chroot isolation, the host's network (the session's test-bed broker on
127.0.0.1), user 10001, the root file system mounted read-only and a tmpfs on /tmp, as the Helm chart runs them.
`txnwatch collect` runs from the collector image (the core package, `pip install txnwatch[msk]`: no Spark in it)
and `txnwatch stream` (the stream extra, Spark's Kafka connector, the JRE) from the stream image; a real orphan (dev/workload.py --scenario hanging) must come out as an OPENED candidate,
and `txnwatch proposals abort --execute` from the collector image must end it: the record behind it reaches a
read_committed reader.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_stream_e2e import read_topic, wait_for
from workloads import produce_plain, read_committed_values, run_workload

from detectors.models import AbortCandidate
from dev import image

# A cold build of the images (bases included) happens in the first test's setup when `make image` did not run
# before; pytest-timeout counts it.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

CLUSTER = "image-test"
ENTRYPOINT = "/opt/txnwatch/entrypoint.sh"
# Spark's first micro-batch in the container, then the grace and two collector sweeps: generous on a shared
# 2-core machine; a candidate that never comes fails.
DETECTION_TIMEOUT_S = 420.0
RUN_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """Both targets, built if their inputs changed since the last build (`make test` builds them before)."""
    return {built.target: built.name for built in image.build()}


def stop(proc: subprocess.Popen[str], ctr: image.Container) -> None:
    """SIGTERM to `buildah run` and everything it started in its process group, then what is left inside the
    container (by its root directory), SIGKILL after 30 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
        for pid in ctr.processes():
            with contextlib.suppress(ProcessLookupError):  # it ended between the listing and the signal
                os.kill(pid, sig)
        deadline = time.monotonic() + 30
        while (proc.poll() is None or ctr.processes()) and time.monotonic() < deadline:
            time.sleep(0.5)
        if proc.poll() is not None and not ctr.processes():
            return


def start(ctr: image.Container, log: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ctr.run(ENTRYPOINT, *args, env=env),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


@pytest.fixture
def containers(images: dict[str, str]) -> Iterator[tuple[image.Container, image.Container]]:
    with image.container(images["collector"]) as collector, image.container(images["stream"]) as stream:
        yield collector, stream


def said_in(ctr: image.Container, script: str, user: str = "10001:10001") -> str:
    """What `script` prints in the container (its errors too), ended by a line `done`. `buildah run` has lost the
    end of a short-lived container's output now and then (seen once in CI, on the last command's error): asked up
    to three times until the whole output is there."""
    out = ""
    for _ in range(3):
        done = subprocess.run(
            ctr.run("sh", "-c", f"{{ {script}; }} 2>&1; echo done", user=user),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        out = done.stdout
        if out.endswith("done\n"):
            return out
    raise AssertionError(f"no whole output from the container: {out!r} {done.stderr!r}")


def test_the_root_file_system_is_read_only_and_the_user_is_not_root(
    containers: tuple[image.Container, image.Container],
) -> None:
    for ctr in containers:
        out = said_in(
            ctr, "id -u; touch /tmp/ok && echo tmp-writable; touch /home/txnwatch/x || echo refused"
        )
        lines = out.splitlines()
        assert lines[:2] == ["10001", "tmp-writable"], out
        assert "Read-only file system" in out and lines[-2:] == ["refused", "done"], out
        # Read-only for root too: it is the mount, not file permissions. And root has no capability left.
        out = said_in(
            ctr, "grep -E '^Cap(Eff|Bnd):' /proc/self/status; touch /opt/x || echo refused", user="0:0"
        )
        assert "Read-only file system" in out and out.splitlines()[-2:] == ["refused", "done"], out
        assert out.split()[:4] == ["CapEff:", "0" * 16, "CapBnd:", "0" * 16], out


def test_the_images_carry_their_version(images: dict[str, str]) -> None:
    for name in images.values():
        labels = image.image_labels(name)
        assert labels["org.opencontainers.image.version"] == image.version()
        assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
        # The commit of the sources it was built from (a later commit that changed none of them reuses it).
        commit = labels["org.opencontainers.image.revision"].removesuffix("-dirty")
        assert (
            subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=image.ROOT).returncode == 0
        )


# The stream extra's top-level modules (pyproject.toml: pyspark and py4j, pandas, pyarrow, protobuf).
STREAM_EXTRA_MODULES = ("pyspark", "py4j", "pandas", "pyarrow", "google.protobuf")
# Which of the modules named on the command line the image's Python finds (a dotted one whose parent is missing
# raises instead of answering None).
FIND_MODULES = """
import importlib.util, sys
def found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
print(",".join(m for m in sys.argv[1:] if found(m)))
"""


def test_the_collector_image_is_the_core_package_without_spark(
    containers: tuple[image.Container, image.Container],
) -> None:
    """The collector image installs `txnwatch` without the stream extra; the stream image installs it with. From
    the collector image, `txnwatch stream` says what to install instead of a traceback."""
    importable = []
    for ctr in containers:
        done = subprocess.run(
            ctr.run("python", "-c", FIND_MODULES, *STREAM_EXTRA_MODULES),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        importable.append(done.stdout.strip())
    assert importable == ["", ",".join(STREAM_EXTRA_MODULES)]  # collector, stream
    collector_ctr, _ = containers
    done = subprocess.run(
        collector_ctr.run(ENTRYPOINT, "stream", "--bootstrap-server", "127.0.0.1:1"),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "pip install 'txnwatch[stream]'" in done.stderr and "Traceback" not in done.stderr, done.stderr


# Amazon MSK IAM in the images: MSK's signer is local (SigV4 presigning of a kafka-cluster:Connect URL), so static
# keys in the environment sign a real token with no AWS endpoint; only the profile files and instance metadata are
# kept out, so that nothing but these keys can be picked up.
MSK_REGION = "eu-central-1"
MSK_AWS_ENV = {
    "AWS_REGION": MSK_REGION,
    "AWS_ACCESS_KEY_ID": "AKIDTXNWATCHTEST",
    "AWS_SECRET_ACCESS_KEY": "not-a-secret",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/nonexistent",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
}
MSK_CLASSES = (
    "software.amazon.msk.auth.iam.IAMLoginModule",
    "software.amazon.msk.auth.iam.IAMClientCallbackHandler",
)
# Loads each class named on the command line as Kafka does (public no-argument constructor), then signs a token
# with MSK's OAUTHBEARER callback handler, which runs MSK's code against the AWS SDK the image resolved (2.35.4, not
# the 2.30.23 aws-msk-iam-auth was built with): a mismatch between the two fails here, not at a customer's broker.
MSK_IAM_CHECK_JAVA = """
import java.util.List;
import java.util.Map;
import javax.security.auth.callback.Callback;
import javax.security.auth.login.AppConfigurationEntry;
import org.apache.kafka.common.security.auth.AuthenticateCallbackHandler;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerTokenCallback;

public class MskIamCheck {
    public static void main(String[] args) throws Exception {
        for (String name : args) {
            Class.forName(name).getDeclaredConstructor().newInstance();
        }
        AuthenticateCallbackHandler handler = (AuthenticateCallbackHandler) Class.forName(
            "software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler").getDeclaredConstructor().newInstance();
        handler.configure(Map.of(), "OAUTHBEARER", List.of(new AppConfigurationEntry(
            OAuthBearerLoginModule.class.getName(), AppConfigurationEntry.LoginModuleControlFlag.REQUIRED, Map.of())));
        OAuthBearerTokenCallback callback = new OAuthBearerTokenCallback();
        handler.handle(new Callback[] {callback});
        System.out.println(callback.token().value());
    }
}
"""
# The collector side's MSK IAM path (common/oauth.py) as the collector and the abort build it.
MSK_IAM_CHECK_PY = (
    "from common.oauth import MskIamTokenProvider, token_provider; "
    "p = token_provider({'sasl_oauth_aws_msk_iam': True}); "
    "assert isinstance(p, MskIamTokenProvider); print(p.token())"
)


def msk_connect_url(token: str) -> tuple[str, dict[str, list[str]]]:
    """The host and query of the presigned URL an MSK IAM token encodes (base64url, unpadded)."""
    url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    parts = urllib.parse.urlsplit(url)
    return parts.netloc, urllib.parse.parse_qs(parts.query)


def assert_msk_token_signed_with_the_test_keys(token: str) -> None:
    host, query = msk_connect_url(token)
    assert host == f"kafka.{MSK_REGION}.amazonaws.com", host
    assert query["Action"] == ["kafka-cluster:Connect"], query
    assert query["X-Amz-Credential"][0].startswith(MSK_AWS_ENV["AWS_ACCESS_KEY_ID"] + "/"), query
    assert len(query["X-Amz-Signature"][0]) == 64, query


def test_the_stream_images_spark_class_path_has_msk_iam_login(
    containers: tuple[image.Container, image.Container], tmp_path: Path
) -> None:
    """aws-msk-iam-auth (dev/jvm/spark/pom.xml) on the class path Spark runs with in the image: pyspark's jars
    and the image's jars/spark folder (streaming/session.py hands the latter to spark.jars). The check class is
    compiled here, against `make jars`' copy of the same jars, and handed in through the environment (the
    container's root is read-only; /tmp is its tmpfs)."""
    _, stream_ctr = containers
    source = tmp_path / "MskIamCheck.java"
    source.write_text(MSK_IAM_CHECK_JAVA)
    jars = image.ROOT / ".cache" / "jars" / "spark"
    subprocess.run(
        ["javac", "--release", "17", "-cp", f"{jars}/*", "-d", str(tmp_path), str(source)],
        check=True,
        timeout=RUN_TIMEOUT_S,
    )
    check_class = base64.b64encode((tmp_path / "MskIamCheck.class").read_bytes()).decode()
    script = (
        'printf %s "$CHECK_CLASS" | base64 -d > /tmp/MskIamCheck.class && exec "$JAVA_HOME/bin/java" -Xmx128m '
        '-cp "/tmp:$TXNWATCH_STREAM__JARS_DIR/spark/*:$SPARK_HOME/jars/*" MskIamCheck "$@"'
    )
    done = subprocess.run(
        stream_ctr.run(
            "sh", "-c", script, "sh", *MSK_CLASSES, env={**MSK_AWS_ENV, "CHECK_CLASS": check_class}
        ),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert_msk_token_signed_with_the_test_keys(done.stdout.split()[-1])


def test_both_images_sign_msk_iam_tokens_for_the_python_components(
    containers: tuple[image.Container, image.Container],
) -> None:
    """aws-msk-iam-sasl-signer-python (pyproject's msk extra) in both images: common/oauth.py's MSK IAM provider
    signs a token, as `sasl.mechanism=OAUTHBEARER` with MSK's IAMOAuthBearerLoginCallbackHandler makes it do."""
    for ctr in containers:
        done = subprocess.run(
            ctr.run("python", "-c", MSK_IAM_CHECK_PY, env=MSK_AWS_ENV),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert_msk_token_signed_with_the_test_keys(done.stdout.split()[-1])


def test_collect_and_stream_from_the_images_find_and_abort_a_real_orphan(
    containers: tuple[image.Container, image.Container], bootstrap: str, tmp_path: Path
) -> None:
    collector_ctr, stream_ctr = containers
    prefix = f"img{uuid.uuid4().hex[:8]}"
    common = ("--bootstrap-server", bootstrap, "--cluster", CLUSTER, "--topic-prefix", prefix)
    collector = start(
        collector_ctr,
        tmp_path / "collect.log",
        "collect",
        *common,
        "--interval-ms",
        "5000",
        "--metrics-port",
        "0",
    )
    stream = start(
        stream_ctr,
        tmp_path / "stream.log",
        "stream",
        *common,
        "--checkpoint-location",
        "/tmp/checkpoints",
        "--starting-offsets",
        "earliest",
        "--master",
        "local[2]",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--conf",
        "spark.ui.enabled=false",
        "--metrics-port",
        "0",
        "--output",
        "json",
        HOME="/tmp",
        SPARK_LOCAL_IP="127.0.0.1",
    )
    try:
        truth = run_workload(bootstrap, "--scenario", "hanging", "--topic-prefix", f"{prefix}-hang-")
        (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
        topic, partition, start_offset = h["topic"], h["partition"], h["start_offset"]
        produce_plain(bootstrap, topic, partition, b"after-the-orphan")
        made = time.monotonic()
        assert read_committed_values(bootstrap, topic, partition, start_offset, timeout_s=3) == []

        def opened() -> list[AbortCandidate]:
            assert collector.poll() is None, (tmp_path / "collect.log").read_text()[-3000:]
            assert stream.poll() is None, (tmp_path / "stream.log").read_text()[-3000:]
            return [
                c
                for c in (
                    AbortCandidate.model_validate_json(r.value)
                    for r in read_topic(bootstrap, f"{prefix}.abort-candidates")
                    if r.value is not None
                )
                if c.topic == topic and c.status.value == "OPENED"
            ]

        (candidate,) = wait_for(opened, DETECTION_TIMEOUT_S, "the orphan's OPENED candidate from the images")
        assert (candidate.partition, candidate.start_offset, candidate.spec.producer_id) == (
            partition,
            start_offset,
            h["producer_id"],
        )
        print(f"\ncandidate from the images {time.monotonic() - made:.1f}s after the orphan")
        # Both components really ran inside the containers, as user 10001.
        for ctr in containers:
            pids = ctr.processes()
            assert pids and {image.process_uid(pid) for pid in pids} == {10001}

        done = subprocess.run(
            collector_ctr.run(
                ENTRYPOINT,
                "proposals",
                "abort",
                candidate.candidate_id,
                "--execute",
                "--actor",
                "image-test",
                *common,
                "--output",
                "json",
            ),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout)["outcome"] == "ABORTED"
        # The orphan is over: the last stable offset moved past it, the record behind it is readable.
        assert b"after-the-orphan" in read_committed_values(bootstrap, topic, partition, start_offset)
    finally:
        stop(stream, stream_ctr)
        stop(collector, collector_ctr)
    # No log line per state key: every producer id and transactional id new to the job is a state miss.
    misses = [
        line
        for line in (tmp_path / "stream.log").read_text(errors="replace").splitlines()
        if "doesn't contain key" in line
    ]
    assert misses == [], misses[:5]
