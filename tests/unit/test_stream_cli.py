"""`txnwatch stream` before Spark starts: an unreachable cluster is one clear line, a malformed --conf is a usage
error, its settings come from TXNWATCH_* then the flags, and the sessions it builds draw no console progress bars."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_stream_against_an_unreachable_cluster_fails_with_one_line(tmp_path: Path) -> None:
    # Port 1 on loopback refuses at once; nothing listens there.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "txnwatch_cli",
            "stream",
            "--bootstrap-server",
            "127.0.0.1:1",
            "--checkpoint-location",
            str(tmp_path / "ck"),
            "--seconds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")},
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("txnwatch stream: ") and "127.0.0.1:1" in lines[0]
    assert done.stdout == ""
    assert not (tmp_path / "ck").exists()  # it stopped before Spark or the job touched anything


class _Builder:
    """Records what build_session configures instead of starting a JVM."""

    def __init__(self) -> None:
        self.conf: dict[str, str] = {}

    def master(self, _master: str) -> _Builder:
        return self

    def appName(self, _name: str) -> _Builder:
        return self

    def config(self, key: str, value: str) -> _Builder:
        self.conf[key] = value
        return self

    def getOrCreate(self) -> dict[str, str]:
        return self.conf


def _built_conf(monkeypatch: pytest.MonkeyPatch, extra: dict[str, str] | None = None) -> Any:
    from streaming import session

    class FakeSparkSession:
        builder = _Builder()

    # build_session sets these for Spark's Python workers; monkeypatch puts them back afterwards.
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setattr(session, "SparkSession", FakeSparkSession)
    return session.build_session(master="local[1]", extra_conf=extra, jars=[])


def test_sessions_draw_no_console_progress_bars(monkeypatch: pytest.MonkeyPatch) -> None:
    # The bars overwrite the console view's lines and fill logs with carriage returns.
    assert _built_conf(monkeypatch)["spark.ui.showConsoleProgress"] == "false"
    # --conf still wins, for someone who wants them back
    on = _built_conf(monkeypatch, {"spark.ui.showConsoleProgress": "true"})
    assert on["spark.ui.showConsoleProgress"] == "true"


def test_the_driver_heap_is_fixed_at_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    # G1 resizing the committed heap made the RSS swing by 400 MB in the hour-long soak (docs/reliability.md).
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert _built_conf(monkeypatch)["spark.driver.extraJavaOptions"] == "-Xms1g -XX:+AlwaysPreTouch"
    given = _built_conf(monkeypatch, {"spark.driver.memory": "3g", "spark.driver.extraJavaOptions": "-Dx=y"})
    assert given["spark.driver.extraJavaOptions"] == "-Dx=y -Xms3g -XX:+AlwaysPreTouch"


@pytest.mark.parametrize(
    ("memory", "options", "expected"),
    [
        ("2g", "", "-Xms2g -XX:+AlwaysPreTouch"),
        ("1536", "", "-Xms1536m -XX:+AlwaysPreTouch"),  # Spark reads a bare number as MiB, the JVM as bytes
        ("2g", " -Dx=y ", "-Dx=y -Xms2g -XX:+AlwaysPreTouch"),
        ("2g", "-Xms512m -Dx=y", "-Xms512m -Dx=y"),  # someone's own -Xms wins
    ],
)
def test_fixed_heap_options(memory: str, options: str, expected: str) -> None:
    from streaming.session import fixed_heap_options

    assert fixed_heap_options(memory, options) == expected


def test_bound_malloc_returns_a_passing_block_to_the_system(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the soak saw: a 3.8 MB block malloc'd and freed stayed in malloc's heap. With the fixed threshold it is
    mapped on its own and unmapped when freed; the variables reach the JVM the session starts."""
    import ctypes

    from dev.memory import native_python
    from streaming.session import MALLOC_ENV, bound_malloc

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    # The process's history, as glibc's default has it: a 5 MB block mapped on its own and freed raises the size
    # above which blocks are mapped to 5 MB, so the next 3.8 MB block would come from the heap and stay there.
    libc.free(ctypes.c_void_p(libc.malloc(5_000_000)))
    for key in MALLOC_ENV:
        monkeypatch.setenv(key, "")  # recorded, so the test's end takes them away again
        monkeypatch.delenv(key)
    bound_malloc()
    assert {k: os.environ[k] for k in MALLOC_ENV} == MALLOC_ENV
    before = native_python()
    block = libc.malloc(3_800_000)
    ctypes.memset(block, 1, 3_800_000)  # touched, as a real buffer is
    libc.free(ctypes.c_void_p(block))
    after = native_python()
    assert after["malloc_heap_mb"] - before["malloc_heap_mb"] < 0.5
    assert after["malloc_free_mb"] - before["malloc_free_mb"] < 0.5


# ------------------------------------------------------------------------------------ flags and settings


def _parse(*argv: str) -> Any:
    import txnwatch_cli

    return txnwatch_cli.build_parser().parse_args(["stream", *argv])


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("TXNWATCH_"):
            monkeypatch.delenv(key)


@pytest.mark.parametrize("value", ["spark.sql.shuffle.partitions", "=2", ""])
def test_conf_without_key_and_value_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    # It used to pass the parser and crash with a ValueError traceback after the bootstrap check.
    with pytest.raises(SystemExit) as exc:
        _parse("--conf", value)
    assert exc.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith(("usage:", " "))]
    assert errors == [f"txnwatch stream: error: argument --conf: expected KEY=VALUE, got {value!r}"]


def test_conf_keeps_everything_after_the_first_equals_sign() -> None:
    args = _parse("--conf", "a=1", "--conf", "spark.driver.extraJavaOptions=-Dx=y")
    assert args.conf == [("a", "1"), ("spark.driver.extraJavaOptions", "-Dx=y")]


@pytest.mark.usefixtures("clean_env")
def test_stream_settings_environment_then_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from streaming.cli import load_settings

    monkeypatch.setenv("TXNWATCH_STREAM__TRIGGER", "1 second")
    monkeypatch.setenv("TXNWATCH_STREAM__STATE_BUCKETS", "8")
    monkeypatch.setenv("TXNWATCH_STREAM__METRICS_PORT", "9999")
    monkeypatch.setenv("TXNWATCH_CHECKPOINT_LOCATION", "/old/ck")  # its name before the stream section
    s, _, _ = load_settings(_parse("--state-buckets", "16", "--master", "local[2]"))
    st = s.stream
    assert (st.trigger, st.state_buckets, st.metrics_port) == ("1 second", 16, 9999)
    assert (st.checkpoint_location, st.master) == ("/old/ck", "local[2]")
    s, _, _ = load_settings(_parse("--checkpoint-location", "/flag/ck"))
    assert s.stream.checkpoint_location == "/flag/ck"


@pytest.mark.usefixtures("clean_env")
def test_flag_defaults_are_the_settings_defaults() -> None:
    from common.settings import StreamSettings
    from streaming.cli import load_settings

    s, _, _ = load_settings(_parse())
    assert s.stream == StreamSettings()


@pytest.mark.usefixtures("clean_env")
def test_stream_options_from_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from streaming.cli import load_settings, stream_options

    props = tmp_path / "client.properties"
    props.write_text(
        "bootstrap.servers=file:9092\nsecurity.protocol=SASL_SSL\nsasl.mechanism=PLAIN\ngroup.id=g\n"
    )
    monkeypatch.chdir(tmp_path)
    args = _parse(
        "--command-config",
        str(props),
        "--bootstrap-server",
        "flag:9092",
        "--checkpoint-location",
        "ck",
        "--coordinator-max-offsets-per-trigger",
        "500",
        "--cluster",
        "c1",
    )
    settings, ignored, java = load_settings(args)
    assert ignored == ("group.id: unknown to txnwatch (dropped)",)
    opts = stream_options(settings, java, command_config=args.command_config, is_terminal=False)
    # Spark gets the file as it is (Java properties), with the bootstrap servers the flag chose.
    assert opts.kafka_options == {
        "bootstrap.servers": "flag:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "group.id": "g",
    }
    # The job reads its settings from opts.settings.stream, the checkpoint location made absolute.
    assert opts.settings.stream.checkpoint_location == str(tmp_path / "ck")
    assert (opts.settings.stream.coordinator_max_offsets_per_trigger, opts.settings.stream.state_buckets) == (
        500,
        32,
    )
    assert opts.settings.stream.model_dump(exclude={"checkpoint_location"}) == settings.stream.model_dump(
        exclude={"checkpoint_location"}
    )
    assert (opts.settings.cluster, opts.command_config_path, opts.output) == ("c1", str(props), "json")
    assert settings.kafka.client_kwargs()["bootstrap_servers"] == "flag:9092"


def test_connector_jars_come_from_the_settings_folder(tmp_path: Path) -> None:
    from streaming.session import connector_jars

    (tmp_path / "spark").mkdir()
    (tmp_path / "spark" / "b.jar").write_text("")
    (tmp_path / "spark" / "a.jar").write_text("")
    assert connector_jars(tmp_path) == [str(tmp_path / "spark" / "a.jar"), str(tmp_path / "spark" / "b.jar")]
    with pytest.raises(RuntimeError, match="run `make jars`"):
        connector_jars(tmp_path / "empty")


@pytest.mark.usefixtures("clean_env")
def test_checkpoint_uri_kept_local_path_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streaming.cli import load_settings, stream_options

    monkeypatch.chdir(tmp_path)

    def checkpoint(location: str) -> str:
        settings, _, java = load_settings(_parse("--checkpoint-location", location))
        return stream_options(settings, java, is_terminal=False).settings.stream.checkpoint_location

    # An object-store checkpoint is a Hadoop URI, not a folder named `s3a:` under the working directory.
    assert checkpoint("s3a://bucket/txnwatch/ck") == "s3a://bucket/txnwatch/ck"
    assert checkpoint("file:///var/lib/ck") == "file:///var/lib/ck"
    assert checkpoint("ck") == str(tmp_path / "ck")
    assert checkpoint("/var/lib/ck") == "/var/lib/ck"
