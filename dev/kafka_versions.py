"""Which Apache Kafka release the test bed runs, and what each release needs and accepts (the compatibility matrix).

Every release comes from Maven Central: `ensure_jars(version)` writes a POM for that version (the broker `kafka_2.13`,
`kafka-tools` for TransactionsCommand, and the logging binding the release's distribution ships) and has Maven copy
it with its runtime dependencies into `.cache/jars/kafka-<version>/`. The default release (DEFAULT_VERSION) stays in
`.cache/jars/kafka`, resolved by `make jars` from dev/jvm/kafka/pom.xml, so nothing that predates the matrix moves.

What differs between releases, as read from their POMs and configs:
- Kafka 3.x logs through log4j 1 (reload4j and slf4j-reload4j in the distribution's libs/, neither in the POM);
  Kafka 4 through Log4j2 (KIP-653), also not in the POM.
- KRaft's combined mode is production-ready from 3.5 on (the matrix starts there); ZooKeeper mode exists up to 3.9
  (removed in 4.0, KIP-833). kafka_2.13 3.x depends on org.apache.zookeeper:zookeeper, whose ZooKeeperServerMain
  is the ZooKeeper server of a ZooKeeper bed.
- `transaction.partition.verification.enable` exists from 3.6 (KIP-890 part 1); 3.5 has no verification at all.
- The `transaction.version` feature: 3.9's server-common already lists it (Features.TRANSACTION_VERSION), but
  transaction version 2 (KIP-890 part 2) is production-ready from 4.0; the test bed formats it from 4.0 on
  (`kafka-storage format --feature`), and before that every transaction is what 4.x calls version 0.
- `kafka-storage format --add-scram` exists from 3.5 (KIP-900).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from common.jars import jars_dir

DEFAULT_VERSION = "4.3.1"
# The newest patch of each minor on Maven Central (maven-metadata.xml of org.apache.kafka:kafka_2.13, 2026-11-27).
LATEST_PATCHES = ("3.5.2", "3.6.2", "3.7.2", "3.8.1", "3.9.2", "4.0.2", "4.1.2", "4.2.2", "4.3.1", "4.4.0")
SETTINGS_XML = Path(__file__).resolve().parent / "jvm" / "settings.xml"
MVN_TIMEOUT_S = 1200


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3])


def at_least(version: str, minimum: str) -> bool:
    return version_tuple(version) >= version_tuple(minimum)


def logs_through_log4j1(version: str) -> bool:
    """Kafka 3.x: log4j 1 (reload4j) with a log4j.properties; Kafka 4: Log4j2 (KIP-653)."""
    return not at_least(version, "4.0.0")


def has_zookeeper_mode(version: str) -> bool:
    """ZooKeeper mode was removed in 4.0 (KIP-833)."""
    return not at_least(version, "4.0.0")


def has_partition_verification(version: str) -> bool:
    """`transaction.partition.verification.enable` came with KIP-890 part 1 in 3.6."""
    return at_least(version, "3.6.0")


def has_transaction_version_feature(version: str) -> bool:
    """Whether the test bed formats the `transaction.version` feature (KIP-890 part 2): from 4.0 on, where version 2
    is production-ready; before, every transaction is what 4.x calls transaction version 0."""
    return at_least(version, "4.0.0")


def version_jars_dir(version: str) -> Path:
    """Where a release's jars live: `.cache/jars/kafka` for the default (what `make jars` fills),
    `.cache/jars/kafka-<version>` for every other."""
    if version == DEFAULT_VERSION:
        return jars_dir() / "kafka"
    return jars_dir() / f"kafka-{version}"


def _logging_dependencies(version: str) -> str:
    if logs_through_log4j1(version):
        # What bin/kafka-run-class.sh of a 3.x distribution has on its class path (libs/): slf4j 1.7's reload4j
        # binding and reload4j, the maintained log4j 1.2.
        return """
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId><version>1.7.36</version></dependency>
    <dependency><groupId>ch.qos.reload4j</groupId><artifactId>reload4j</artifactId><version>1.2.25</version></dependency>"""
    # As dev/jvm/kafka/pom.xml: metrics-core drags in slf4j 1.7, the Log4j2 binding needs the slf4j 2 API.
    return """
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>2.0.17</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>2.25.3</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>2.25.3</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-1.2-api</artifactId><version>2.25.3</version></dependency>"""


def pom_text(version: str) -> str:
    """The POM Maven resolves a release from: the broker, kafka-tools (without Connect) and its logging binding."""
    # ZooKeeper's own POM asks for logback; the 3.x distribution leaves it out (one slf4j binding: reload4j).
    zookeeper_exclusions = "<exclusions><exclusion><groupId>ch.qos.logback</groupId><artifactId>*</artifactId></exclusion></exclusions>"
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by dev/kafka_versions.py for Apache Kafka {version}. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.txnwatch</groupId>
  <artifactId>testbed-kafka-{version}</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{version}</version>
      {zookeeper_exclusions}
    </dependency>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{version}</version>
      <exclusions>
        <exclusion><groupId>org.apache.kafka</groupId><artifactId>connect-runtime</artifactId></exclusion>
        <exclusion><groupId>ch.qos.logback</groupId><artifactId>*</artifactId></exclusion>
      </exclusions>
    </dependency>{_logging_dependencies(version)}
  </dependencies>
</project>
"""


def ensure_jars(version: str) -> Path:
    """The jars folder of `version`, resolved by Maven from Maven Central the first time (a `.resolved` stamp makes
    later calls free). The default release is `make jars`' business: it is only checked."""
    directory = version_jars_dir(version)
    if version == DEFAULT_VERSION or (directory / ".resolved").exists():
        return directory
    pom_dir = jars_dir() / "poms" / version
    pom_dir.mkdir(parents=True, exist_ok=True)
    (pom_dir / "pom.xml").write_text(pom_text(version))
    partial = directory.with_name(directory.name + ".partial")
    subprocess.run(["rm", "-rf", str(partial)], check=True)
    done = subprocess.run(
        [
            os.environ.get("MVN", "mvn"),
            "-q",
            "-B",
            "-s",
            str(SETTINGS_XML),
            "-f",
            str(pom_dir / "pom.xml"),
            "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={partial}",
        ],
        capture_output=True,
        text=True,
        timeout=MVN_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"Maven could not resolve Apache Kafka {version}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    (partial / ".resolved").touch()
    # Renamed into place only when complete: a test bed never starts from half a download.
    subprocess.run(["rm", "-rf", str(directory)], check=True)
    partial.rename(directory)
    return directory


def describe_brokers(admin: Any) -> list[dict[str, Any]]:
    """kafka-python's `describe_cluster()["brokers"]`, on every release. kafka-python 3.0.12 pops DescribeCluster
    v1's `endpoint_type` (KIP-919, Kafka 3.7) from every answer: a 3.5 or 3.6 broker answers v0 and the call raises
    KeyError('endpoint_type'). Then the brokers of a Metadata answer (which lists no fenced broker)."""
    try:
        return list(admin.describe_cluster()["brokers"])
    except KeyError:
        metadata = admin._manager.run(admin._get_cluster_metadata, [])
        return [{**b, "broker_id": b["node_id"]} for b in metadata["brokers"]]


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m dev.kafka_versions",
        description="Resolve Apache Kafka releases' jars from Maven Central.",
    )
    parser.add_argument("versions", nargs="*", default=list(LATEST_PATCHES))
    args = parser.parse_args()
    failed = 0
    for version in args.versions:
        try:
            print(f"{version}: {ensure_jars(version)}", flush=True)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"{version}: FAILED {exc}", flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
