"""The SparkSession txnwatch runs on: RocksDB state store, Spark's Kafka connector jars, the venv's Python.

Jars must be on the first SparkSession of a process (the driver class loader is fixed when the JVM starts), so
every entry point builds its session here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from common import jars as common_jars

ROOT = Path(__file__).resolve().parent.parent

# How glibc's malloc holds memory, for the job's processes. By default it gives a thread that allocates while
# another holds the lock an arena of its own (up to 8 per core), and it raises the size above which a block is
# mapped on its own each time such a block is freed (up to 32 MB); blocks below it come from an arena, and what is
# freed there is kept for reuse rather than returned. In the hour-long soak the driver's Python used a steady
# 32 MB of malloc's memory, yet its RSS stepped up by 3.7 MB twice: each time malloc took 3.8 MB from the system
# for a passing block and kept it free afterwards (docs/reliability.md). A fixed threshold (glibc's starting
# value, 128 KB) returns such blocks when they are freed; two arenas keep the JVM's 200-odd threads from
# spreading what they hold free over 8 arenas per core.
MALLOC_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072"}
_MALLOPT = {"MALLOC_ARENA_MAX": -8, "MALLOC_MMAP_THRESHOLD_": -3}  # M_ARENA_MAX, M_MMAP_THRESHOLD (malloc.h)

BASE_CONF: dict[str, str] = {
    # transformWithState needs RocksDB; the OSS default (HDFS-backed) is rejected (transformWithState checks the provider class at query start).
    "spark.sql.streaming.stateStore.providerClass": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # One memory budget for every RocksDB instance of the process (block cache and write buffers together), so
    # native memory cannot grow with the number of state stores over weeks; the pod's memory limit is set from
    # it (docs/deploy.md). Spark's default is unbounded: each instance sizes its own buffers.
    "spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage": "true",
    "spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB": "500",
    # Batches of offsets, commits and state versions the checkpoint keeps (Spark's default is 100). A restart
    # needs only the last one; the window is what the checkpoint's size levels off at, and Spark deletes in
    # steps of 30% of it. At 100 the windows query (a batch every 20 s or so) filled its window only after
    # 45 minutes, so the hour-long soak's checkpoint was still growing in its second half (docs/reliability.md).
    "spark.sql.streaming.minBatchesToRetain": "20",
    # The driver's status store keeps the last N jobs, stages and SQL executions (1,000 each by default, kept
    # even with the UI off). A micro-batch is several of each, three queries every 5 s, so the defaults take
    # the better part of an hour to fill: the driver's live heap climbed for its first 25 minutes in the
    # hour-long soak (docs/reliability.md). 200 keeps the last few minutes for a UI and levels off sooner.
    "spark.ui.retainedJobs": "200",
    "spark.ui.retainedStages": "200",
    "spark.sql.ui.retainedExecutions": "200",
    "spark.sql.session.timeZone": "UTC",
    # Console progress bars redraw over the job's console view and fill captured logs with carriage returns;
    # progress is in the metrics endpoint (txnwatch_stream_*). `--conf spark.ui.showConsoleProgress=true` brings
    # them back.
    "spark.ui.showConsoleProgress": "false",
    # Executors started by Spark (a k8s:// master) hold malloc's memory as the driver does (MALLOC_ENV).
    **{f"spark.executorEnv.{key}": value for key, value in MALLOC_ENV.items()},
}


def bound_malloc() -> None:
    """Bound how much memory malloc holds free, in the JVM this process starts (and the Python workers it forks),
    through the environment they inherit, and in this process itself, through `mallopt`: it started before the
    variables were set, and glibc reads them once. Values already in the environment are kept. Not glibc (macOS):
    nothing to do."""
    for key, value in MALLOC_ENV.items():
        os.environ.setdefault(key, value)
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "gnu_get_libc_version"):
        return
    for key, param in _MALLOPT.items():
        given = os.environ[key]
        if given.isdigit():  # arenas made so far stay; this bounds the ones the job's threads would add
            libc.mallopt(param, int(given))


# Spark's default heap cap for the driver (`spark.driver.memory`).
DEFAULT_DRIVER_MEMORY = "1g"


def fixed_heap_options(driver_memory: str, java_options: str) -> str:
    """The driver JVM's options with its heap fixed at its cap: `-Xms` equal to `spark.driver.memory` (which
    Spark turns into `-Xmx`) and every heap page touched at start.

    Left to itself G1 sizes the committed heap to the allocation rate: over the hour-long soak it swung between
    398 and 791 MB while the live set stayed at 132 MB, and the process's RSS followed it (docs/reliability.md).
    A fixed heap makes the RSS one level from the first minute, which a pod's memory limit can be set from.
    Options that already set `-Xms` are kept as they are."""
    if "-Xms" in java_options:
        return java_options
    size = driver_memory.strip()
    if size.isdigit():  # Spark reads a bare number as MiB, the JVM as bytes
        size += "m"
    return " ".join(filter(None, [java_options.strip(), f"-Xms{size}", "-XX:+AlwaysPreTouch"]))


def connector_jars(jars_dir: Path | None = None) -> list[str]:
    """Spark's Kafka connector and the runtime jars pyspark does not ship (kafka-clients, commons-pool2, ...), and
    the s3a file system (hadoop-aws, AWS SDK modules) for `s3a://` checkpoints, from the `spark/` folder of
    `jars_dir` (`txnwatch stream` passes Settings.stream.jars_dir; None: `common.jars.jars_dir()`, TXNWATCH_JARS_DIR or
    the checkout's .cache/jars). As `spark.jars` they are on the driver's class path when this process
    starts the JVM, and reach the executors, which write the stateful stages' state to the checkpoint.

    Raises:
        RuntimeError: no jar there, with what to do.
    """
    directory = common_jars.jars_dir(jars_dir) / "spark"
    jars = sorted(str(p) for p in directory.glob("*.jar"))
    if not jars:
        raise RuntimeError(
            f"no Spark Kafka connector jars in {directory}: run `make jars`, or on a cluster pass "
            "spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version>"
        )
    return jars


def build_session(
    master: str | None = "local[*]",
    app_name: str = "txnwatch",
    extra_conf: Mapping[str, str] | None = None,
    jars: list[str] | None = None,
) -> SparkSession:
    """The session. `master` None: the master `spark-submit` gave (its `spark.master`), else `local[*]`; a master
    given here would override spark-submit's and silently run everything inside the driver. Jars given to
    spark-submit (`--jars`) are kept beside the connector's."""
    # Python workers must run this interpreter so they can import detectors/ and streaming/.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    bound_malloc()
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    # Under spark-submit, its JVM is already up and holds the configuration (PythonRunner hands the driver the
    # gateway's port). A plain `python` start has no JVM yet, and must not start one here: the connector jars
    # have to be on the command line of the JVM the session below launches.
    submitted = SparkConf(loadDefaults=False)
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        SparkContext._ensure_initialized()
        submitted = SparkConf()
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    elif not submitted.contains("spark.master"):
        builder = builder.master("local[*]")
    conf = dict(BASE_CONF)
    given = [j for j in submitted.get("spark.jars", "").split(",") if j]
    ours = connector_jars() if jars is None else jars
    conf["spark.jars"] = ",".join(dict.fromkeys([*given, *ours]))
    conf.update(extra_conf or {})
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # this process starts the JVM: its options still count
        heap = conf.get("spark.driver.memory", DEFAULT_DRIVER_MEMORY)
        options = conf.get("spark.driver.extraJavaOptions", "")
        conf["spark.driver.extraJavaOptions"] = fixed_heap_options(heap, options)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
