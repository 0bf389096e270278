"""Faults, end to end on a three-node test bed: the real `txnwatch collect` and `txnwatch stream` run as
processes (as they run in production) while the cluster and the job are hurt for real.

- a partition's leader moves while it holds a hanging transaction: the collector follows, the verdict stays,
  the candidate is not opened twice, `proposals abort --execute` refuses (`leader-changed-since-start`) until
  the operator acknowledges the move (`--allow-leader-change`), then writes its marker on the new leader;
- a broker is killed (SIGKILL) while the collector sweeps back to back: it reports the gap, keeps sweeping, and
  covers every partition again once the broker is back;
- the Spark driver is killed (SIGKILL of its process group) in the middle of a micro-batch, stays down for three
  times the bed's `transaction.max.timeout.ms` (600 s in `make faults-long`) while orphans, healthy transactions
  and expiring transactional ids come and go, and restarts on the same checkpoint: every orphan gets exactly one
  candidate id, nothing healthy is named;
- every broker stopped for 60 s and started again on the same ports and data: both processes say so once, back
  off, and recover (a new orphan after it gets its candidate); the job's /metrics serves the hanging series of an
  orphan made before it all the while, unchanged and marked stale, and current again after.

One rig (bed, collector, job) serves the module; each test states what it needs from it and leaves it running.
Figures are printed (`-s`) and recorded in docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.structs import TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from test_stream_e2e import wait_for
from test_view_currency_e2e import Healthy
from workloads import (
    ROOT,
    Proposals,
    batches_committed,
    move_leader,
    partition_batches,
    partition_replicas,
    run_workload,
)

from detectors.models import AbortCandidate, PartitionSnapshot
from dev.kafka import Cluster, TestBedConfig, node_running, start_cluster, start_node, stop_cluster, stop_node
from dev.kafka import wait_for_nodes as wait_for_bed

# Each test waits for real minutes (the first also starts the rig: a three-node bed and the job's first batch).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CLUSTER = "faults"
# The bed's transaction.max.timeout.ms is the default 60 s; transactional ids expire after 90 s idle (7 days by
# default) so that ids expire while the job is down.
ID_EXPIRY_MS = 90_000
DETECTION_TIMEOUT_S = 240.0


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60) -> list[Any]:
    """Every record of `topic` up to its end offsets now (a topic written every second never goes quiet, so
    reading until nothing arrives would not end)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        if not parts:
            return []
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        end = consumer.end_offsets(parts)
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in parts):
            assert time.monotonic() < deadline, f"reading {topic} took longer than {timeout_s:.0f}s"
            for records in consumer.poll(timeout_ms=500).values():
                out += records
        return out
    finally:
        consumer.close()


def python(*args: str) -> list[str]:
    return [sys.executable, "-m", "txnwatch_cli", *args]


class Proc:
    """A txnwatch process in its own session (so the whole group, Spark's JVM and Python workers included, can
    be killed), its output in files."""

    def __init__(
        self,
        name: str,
        args: list[str],
        directory: Path,
        *,
        merge: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name, self.args, self.directory, self.merge = name, args, directory, merge
        self.env = env or {}
        self.popen: subprocess.Popen[bytes] | None = None
        self.runs = 0

    @property
    def out(self) -> Path:
        return self.directory / f"{self.name}-{self.runs}.out"

    @property
    def err(self) -> Path:
        return self.directory / f"{self.name}-{self.runs}.err"

    def start(self) -> None:
        self.runs += 1
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.popen = subprocess.Popen(
                self.args,
                stdout=err if self.merge else out,
                stderr=err,
                cwd=ROOT,
                start_new_session=True,
                env=_env() | self.env,
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> None:
        assert self.popen is not None
        os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=30)

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=30)

    def text(self, which: str = "err") -> str:
        return (self.err if which == "err" else self.out).read_text(errors="replace")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TXNWATCH_")} | {
        "PYSPARK_PYTHON": sys.executable
    }


@dataclass
class Rig:
    bed: Cluster
    prefix: str
    collector: Proc
    job: Proc
    checkpoint: Path
    proposals: Proposals

    @property
    def bootstrap(self) -> str:
        return self.bed.bootstrap_servers

    def candidates(self) -> list[AbortCandidate]:
        return [
            AbortCandidate.model_validate_json(r.value)
            for r in read_topic(self.bootstrap, f"{self.prefix}.abort-candidates")
            if r.value is not None
        ]

    def opened(self, topic: str) -> list[AbortCandidate]:
        return [c for c in self.candidates() if c.topic == topic and c.status.value == "OPENED"]

    def orphan(self, name: str) -> dict[str, Any]:
        truth = run_workload(
            self.bootstrap, "--scenario", "hanging", "--topic-prefix", f"{self.prefix}-{name}-"
        )
        (h,) = [t for t in truth["transactions"] if t["kind"] == "hanging"]
        return h  # type: ignore[no-any-return]

    def start_job(self) -> None:
        done = self.batches_done()
        self.job.start()
        wait_for(lambda: self.batches_done() > done or not self.job.alive(), 300, "the job's first batch", 2)
        assert self.job.alive(), self.job.text()[-3000:]

    def metrics_url(self) -> str:
        """The job's /metrics (it says where in its output; the port is picked free and kept for the run)."""
        m = re.search(r"txnwatch stream: metrics on (http://\S+/metrics)", self.job.text("out"))
        assert m, self.job.text("out")[-2000:]
        return m.group(1)

    def batches_done(self) -> int:
        return batches_committed(
            p.name for p in (self.checkpoint / "txnwatch-reconcile" / "commits").glob("*")
        )


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    directory = tmp_path_factory.mktemp("faults")
    bed = start_cluster(
        TestBedConfig(nodes=3, partition_verification=False, transactional_id_expiration_ms=ID_EXPIRY_MS),
        directory / "bed",
    )
    prefix = f"flt{uuid.uuid4().hex[:6]}"
    common = ["--bootstrap-server", bed.bootstrap_servers, "--topic-prefix", prefix, "--cluster", CLUSTER]
    collector = Proc(
        "collector",
        python("collect", *common, "--interval-ms", "1000", "--metrics-port", "0"),
        directory,
        merge=True,
    )
    checkpoint = directory / "checkpoints"
    job = Proc(
        "stream",
        python(
            "stream",
            *common,
            *("--checkpoint-location", str(checkpoint), "--trigger", "2 seconds", "--master", "local[2]"),
            *("--starting-offsets", "earliest", "--expire-after-ms", "20000", "--metrics-port", "0"),
            *("--output", "json"),
        ),
        directory,
        # Ready (and its state current: txnwatch_stream_state_stale 0) while every query moved within 3 triggers
        # plus 20 s: a 60 s outage then shows stale whether the queries wait on Kafka or are stopped.
        env={"TXNWATCH_STREAM__READY_SLACK_S": "20"},
    )
    rig = Rig(
        bed, prefix, collector, job, checkpoint, Proposals(bed.bootstrap_servers, prefix, cluster=CLUSTER)
    )
    try:
        collector.start()
        rig.start_job()
        yield rig
    finally:
        job.stop()
        collector.stop()
        stop_cluster(directory / "bed")
        print(f"\nfault rig logs in {directory}")


# --------------------------------------------------------------------------------------------- leader move


def test_leader_move_keeps_the_verdict_and_the_abort_follows(rig: Rig) -> None:
    h = rig.orphan("move")
    topic, partition, start = h["topic"], h["partition"], h["start_offset"]
    began = time.monotonic()
    (c,) = wait_for(lambda: rig.opened(topic), DETECTION_TIMEOUT_S, "the orphan's candidate", 2)
    print(f"\ndetected in {time.monotonic() - began:.0f}s")
    admin = KafkaAdminClient(bootstrap_servers=rig.bootstrap)
    try:
        old, replicas = partition_replicas(admin, topic, partition)
        new = next(r for r in replicas if r != old)
        moved_s = move_leader(admin, topic, partition, new)
        moved_at_ms = time.time() * 1000
    finally:
        admin.close()

    key = f"{topic}-{partition}".encode()

    def from_new_leader() -> list[PartitionSnapshot]:
        snaps = [
            PartitionSnapshot.model_validate_json(r.value)
            for r in read_topic(rig.bootstrap, f"{rig.prefix}.producer-state")
            if r.key == key and r.value is not None
        ]
        return [
            s
            for s in snaps
            if (s.topic, s.partition) == (topic, partition)
            and s.leader == new
            and s.observed_at_ms > moved_at_ms
        ]

    follows = wait_for(from_new_leader, 120, f"a snapshot of {topic}-{partition} from broker {new}", 3)
    assert [t.start_offset for t in follows[0].open_transactions] == [start]
    followed_s = (follows[0].observed_at_ms - moved_at_ms) / 1000
    # Verdict kept: three more batches of the job over the new leader's snapshots, and still one record for this
    # transaction on the candidates topic (OPENED, the same id), none RESOLVED or opened again.
    seen = rig.batches_done()
    wait_for(lambda: rig.batches_done() >= seen + 3, 120, "three more reconcile batches", 1)
    assert [(x.candidate_id, x.status.value) for x in rig.candidates() if x.topic == topic] == [
        (c.candidate_id, "OPENED")
    ]
    # The leader moved since the orphan began: a commit marker of it could have been lost in an unclean election,
    # so the abort waits for the operator's word (nothing written), then goes through with it.
    refused = rig.proposals.run("abort", c.candidate_id, "--execute", "--actor", "fault-test")
    assert refused.returncode == 3, (refused.stdout, refused.stderr)
    assert "leader-changed-since-start" in refused.stdout
    assert not [b for b in partition_batches(rig.bootstrap, topic, partition) if b.control]
    done = rig.proposals.run(
        "abort", c.candidate_id, "--execute", "--allow-leader-change", "--actor", "fault-test"
    )
    assert done.returncode == 0, done.stderr
    assert f"marker written by broker {new}" in done.stdout
    controls = [
        (b.marker, b.producer_id) for b in partition_batches(rig.bootstrap, topic, partition) if b.control
    ]
    assert controls == [("ABORT", h["producer_id"])]
    wait_for(
        lambda: [x.status.value for x in rig.candidates() if x.topic == topic] == ["OPENED", "RESOLVED"],
        120,
        "the job to resolve the candidate",
        2,
    )
    print(
        f"leader {old} -> {new} in {moved_s:.1f}s; collector's first snapshot from the new leader "
        f"{followed_s:.1f}s later; one candidate, aborted on broker {new}, resolved by the job"
    )


# ------------------------------------------------------------------------------------ broker killed mid-sweep

COVERED = re.compile(r"sweep \S+: (\d+)/(\d+) partitions covered")


def test_broker_killed_mid_sweep_collector_reports_the_gap_and_recovers(rig: Rig, tmp_path: Path) -> None:
    """A second collector sweeps back to back (interval 0.05 s: a sweep is in flight nearly all the time) into
    its own topics. One broker is killed with SIGKILL (no controlled shutdown: its partitions lose their leader
    until the controller notices), then started again on the same ports and data."""
    prefix = f"{rig.prefix}-fast"
    fast = Proc(
        "fast-collector",
        python(
            *("collect", "--bootstrap-server", rig.bootstrap, "--topic-prefix", prefix, "--cluster", CLUSTER),
            *("--interval-ms", "50", "--metrics-port", "0"),
        ),
        tmp_path,
        merge=True,
    )
    fast.start()
    victim = max(n.node_id for n in rig.bed.nodes)
    try:
        wait_for(lambda: len(COVERED.findall(fast.text())) >= 20, 60, "the fast collector's sweeps", 0.5)
        before = len(COVERED.findall(fast.text()))
        stop_node(rig.bed, victim, kill=True)
        killed_at = time.monotonic()
        time.sleep(15)
        gap = COVERED.findall(fast.text())[before:]
        partial = [(int(a), int(b)) for a, b in gap if int(a) < int(b)]
        assert fast.alive(), fast.text()[-3000:]
        start_node(rig.bed, victim)
        restarted_at = time.monotonic()

        def full_again() -> bool:
            # Every partition covered, by sweeps that began after the broker was back.
            tail = COVERED.findall(fast.text())[-5:]
            return len(tail) == 5 and all(a == b for a, b in tail)

        wait_for(full_again, 90, "full coverage again", 0.5)
        recovered_s = time.monotonic() - restarted_at
        assert fast.alive()
        log = fast.text()
        failures = log.count("sweep failed")
        warnings = [line.split(" WARNING ", 1)[1] for line in log.splitlines() if " WARNING " in line]
        stalls = [float(x) for x in re.findall(r"([\d.]+)s between published sweeps", log)]
        print(
            f"\nbroker {victim} killed: {len(gap)} sweeps in the next 15 s, {len(partial)} of them partial, "
            f"{failures} failed, stalls {stalls} s; warnings {warnings}; full coverage {recovered_s:.1f}s after "
            f"the restart ({time.monotonic() - killed_at:.0f}s after the kill)"
        )
        # The gap is reported, not hidden: a stall between published sweeps, partial sweeps or a failed sweep;
        # each distinct problem said once, not once per sweep.
        assert stalls or partial or failures, "the kill left no trace in the collector's output"
        assert len(warnings) == len(set(warnings)), warnings
        assert failures <= 1
    finally:
        fast.stop()
        node = next(n for n in rig.bed.nodes if n.node_id == victim)
        if not node_running(node.pid):
            start_node(rig.bed, victim)


# -------------------------------------------------------------------- driver killed, down, restarted


def in_flight_batch(checkpoint: Path) -> int | None:
    """The reconcile query's batch that has its offsets written but is not committed yet, if any."""
    query = checkpoint / "txnwatch-reconcile"
    offsets = {int(p.name) for p in (query / "offsets").glob("[0-9]*")}
    commits = {int(p.name) for p in (query / "commits").glob("[0-9]*")}
    pending = offsets - commits
    return max(pending) if pending else None


@pytest.mark.parametrize(
    "down_s",
    [
        # Minutes of real waiting, both: `make long` (`make faults-long` runs this file's); make test keeps the
        # 60 s outage of every broker and the other faults of this file.
        pytest.param(180, id="down-3min", marks=[pytest.mark.long, pytest.mark.timeout(1200)]),
        pytest.param(600, id="down-10min", marks=[pytest.mark.long, pytest.mark.timeout(1800)]),
    ],
)
def test_driver_killed_mid_batch_and_down_then_restarted_on_its_checkpoint(rig: Rig, down_s: int) -> None:
    """Orphans are made while the job runs and the driver is killed (SIGKILL of its process group: JVM and
    Python workers) with a reconcile batch in flight. It stays down `down_s` while more orphans come, healthy
    transactions are held open (one commits first: a view behind would see it completed), commit, and their
    transactional ids expire (60 s). Restarted on the same checkpoint: every orphan has exactly one candidate id
    (none lost, none opened twice), and no healthy transaction is ever named."""
    assert rig.job.alive(), rig.job.text()[-3000:]
    batch = f"k{down_s}"
    before_kill = [rig.orphan(f"{batch}-a{i}") for i in range(3)]
    # Kill once a batch is in flight and at least one of these orphans has its candidate.
    wait_for(
        lambda: any(rig.opened(h["topic"]) for h in before_kill), DETECTION_TIMEOUT_S, "a first candidate", 1
    )
    killed_in = wait_for(lambda: in_flight_batch(rig.checkpoint), 60, "a reconcile batch in flight", 0.05)
    rig.job.kill9()
    killed_at = time.monotonic()
    opened_at_kill = {h["topic"] for h in before_kill if rig.opened(h["topic"])}
    print(f"\ndriver killed during batch {killed_in}; {len(opened_at_kill)}/3 orphans had a candidate")

    healthy_topic = f"{rig.prefix}-{batch}-healthy"
    admin = KafkaAdminClient(bootstrap_servers=rig.bootstrap)
    try:
        from kafka.admin import NewTopic

        admin.create_topics([NewTopic(healthy_topic, 3, 3)])
    finally:
        admin.close()
    healthy = [
        Healthy(
            rig.bootstrap,
            healthy_topic,
            p,
            commit_first=p == 1,
            transactional_id=f"{rig.prefix}-{batch}-h{p}",
        )
        for p in (1, 2)
    ]
    for t in healthy:
        t.start()
    during = [rig.orphan(f"{batch}-d{i}") for i in range(2)]
    assert all(t.opened.wait(60) for t in healthy) and not any(t.error for t in healthy)
    run_workload(
        rig.bootstrap,
        "--scenario",
        "steady",
        "--topic-prefix",
        f"{rig.prefix}-{batch}-steady-",
        "--seconds",
        "5",
    )
    # Release the healthy ones after ~40 s (before the bed's 60 s timeout would abort them).
    time.sleep(max(0.0, 40 - (time.monotonic() - killed_at)))
    for t in healthy:
        t.release.set()
        t.join(timeout=60)
        assert t.error is None and not t.released_by_timeout
    remaining = down_s - (time.monotonic() - killed_at)
    assert remaining > 0, f"the downtime work took longer than {down_s}s"
    time.sleep(remaining)

    restarted_at = time.monotonic()
    down_for_s = restarted_at - killed_at
    rig.start_job()
    orphans = before_kill + during
    topics = {h["topic"] for h in orphans}

    def all_opened() -> bool:
        return {c.topic for c in rig.candidates() if c.status.value == "OPENED"} >= topics

    wait_for(all_opened, DETECTION_TIMEOUT_S, "a candidate for every orphan after the restart", 2)
    caught_up_s = time.monotonic() - restarted_at
    # A few more batches: nothing else may appear.
    seen = rig.batches_done()
    wait_for(lambda: rig.batches_done() >= seen + 3, 120, "three more reconcile batches", 1)
    mine = [c for c in rig.candidates() if c.topic.startswith(f"{rig.prefix}-{batch}-")]
    opened = [c for c in mine if c.status.value == "OPENED"]
    ids_by_topic: dict[str, set[str]] = {}
    for c in opened:
        ids_by_topic.setdefault(c.topic, set()).add(c.candidate_id)
    records_per_id: dict[str, list[AbortCandidate]] = {}
    for c in opened:
        records_per_id.setdefault(c.candidate_id, []).append(c)
    print(
        f"down {down_for_s:.0f}s; after the restart every orphan had its "
        f"candidate in {caught_up_s:.0f}s; OPENED: {len(ids_by_topic)} transactions, "
        f"{len(records_per_id)} distinct ids, {len(opened)} records"
    )
    assert set(ids_by_topic) == topics  # nothing else named: not the healthy, not the steady
    assert all(len(ids) == 1 for ids in ids_by_topic.values()), ids_by_topic  # one id per transaction
    for h in orphans:
        (cid,) = ids_by_topic[h["topic"]]
        (c,) = {x.candidate_id: x for x in opened if x.candidate_id == cid}.values()
        assert (c.partition, c.spec.producer_id, c.start_offset) == (
            h["partition"],
            h["producer_id"],
            h["start_offset"],
        )
    # Counted by distinct id (none lost, none opened twice). A batch killed after its sink wrote and before its
    # commit runs again on restart, and Spark's Kafka sink is at-least-once: the same records again, byte for
    # byte (a replay, not a second detection: the same first_detected_ms and evidence).
    assert all(len({r.model_dump_json() for r in rs}) == 1 for rs in records_per_id.values()), records_per_id


# ------------------------------------------------------------------------------------ Kafka down for 60 s

HANGING_SERIES = "txnwatch_hanging_transaction_open_since_timestamp_seconds"
STALE_SERIES = "txnwatch_stream_state_stale"


@dataclass(frozen=True)
class Scrape:
    at_s: float  # monotonic
    status: int
    stale: float | None
    open_since: float | None  # the watched transaction's hanging series, None when absent
    labels: tuple[
        tuple[str, str], ...
    ] = ()  # its labels (the alert's: a change resolves one page, fires another)


def scrape(url: str, topic: str) -> Scrape:
    """One GET of the job's /metrics: its staleness flag and the hanging series of `topic` (one orphan there)."""
    at = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            status, body = response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return Scrape(at, exc.code, None, None)
    stale, open_since, labels = None, None, ()
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == STALE_SERIES:
                stale = sample.value
            elif sample.name == HANGING_SERIES and sample.labels.get("topic") == topic:
                open_since, labels = sample.value, tuple(sorted(sample.labels.items()))
    return Scrape(at, status, stale, open_since, labels)


def scrape_for(url: str, topic: str, seconds: float) -> list[Scrape]:
    out: list[Scrape] = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        out.append(scrape(url, topic))
        time.sleep(2)
    return out


def test_kafka_unreachable_for_60s_both_back_off_say_so_once_and_recover(rig: Rig) -> None:
    """Every broker stopped (SIGTERM to all three at once) for 60 s, then started on the same ports and data. The
    candidates the job had are neither RESOLVED nor OPENED again: a silent collector is no news of an ending."""
    assert rig.job.alive() and rig.collector.alive()
    pre = rig.orphan("pre")
    wait_for(lambda: rig.opened(pre["topic"]), DETECTION_TIMEOUT_S, "a candidate before the outage", 2)
    url = rig.metrics_url()
    before = wait_for(
        lambda: (x := scrape(url, pre["topic"])).open_since is not None and x.stale == 0 and x,
        60,
        "the orphan's hanging series, current",
        2,
    )
    candidates_before = len(rig.candidates())
    collector_before = len(rig.collector.text())
    job_before = len(rig.job.text())
    for n in rig.bed.nodes:  # all at once: the last one alone would wait for a quorum to shut down cleanly
        os.kill(n.pid, signal.SIGTERM)
    for n in rig.bed.nodes:
        stop_node(rig.bed, n.node_id, timeout_s=30)
    stopped_at = time.monotonic()
    # The job's /metrics all through the outage, and until its state is current again.
    down = scrape_for(url, pre["topic"], 60)  # while no broker runs
    assert rig.collector.alive(), rig.collector.text()[-3000:]
    for n in rig.bed.nodes:
        start_node(rig.bed, n.node_id, wait=False)
    wait_for_bed(rig.bed)
    back_at = time.monotonic()
    print(f"\nKafka stopped for {back_at - stopped_at:.0f}s (60 s down + start)")

    recovering: list[Scrape] = []

    def current_again() -> bool:
        recovering.append(scrape(url, pre["topic"]))
        return recovering[-1].stale == 0

    wait_for(current_again, 240, "the job's state to be current again", 2)
    current_s = time.monotonic() - back_at
    # Served all the while, never dropped: a scrape without the series would resolve the hanging page.
    scrapes = down + recovering
    assert all(x.status == 200 and x.labels == before.labels for x in scrapes), [
        (round(x.at_s - stopped_at), x) for x in scrapes if x.status != 200 or x.labels != before.labels
    ]
    stale = [x for x in down if x.stale == 1]
    assert stale, [(round(x.at_s - stopped_at), x.stale) for x in down]
    # With no broker nothing refreshes it: the value the job last knew, as before the outage (a batch that ran
    # as the brokers went down may have moved it by a snapshot's delay, no more).
    assert len({x.open_since for x in stale}) == 1, stale
    assert stale[0].open_since is not None and before.open_since is not None
    assert abs(stale[0].open_since - before.open_since) <= 10
    print(
        f"/metrics: {len(scrapes)} scrapes from the stop until current again, all 200 with the orphan's hanging "
        f"series; stale from {stale[0].at_s - stopped_at:.0f}s after the stop (window 3 triggers + 20 s); "
        f"current again {current_s:.0f}s after the brokers were back ({len(recovering)} scrapes)"
    )

    def collector_recovered() -> bool:
        return "sweeps succeed again" in rig.collector.text()[collector_before:]

    wait_for(collector_recovered, 120, "the collector's first successful sweep", 1)
    collector_s = time.monotonic() - back_at
    h = rig.orphan("after")
    made = time.monotonic()
    wait_for(lambda: rig.opened(h["topic"]), DETECTION_TIMEOUT_S, "a candidate for an orphan made after", 2)
    detected_s = time.monotonic() - made
    seen = rig.batches_done()
    wait_for(lambda: rig.batches_done() >= seen + 5, 120, "five more reconcile batches", 1)
    assert rig.collector.alive() and rig.job.alive(), rig.job.text()[-3000:]
    since = [(c.topic, c.status.value) for c in rig.candidates()[candidates_before:]]
    assert since == [(h["topic"], "OPENED")], since  # nothing resolved or opened again by the outage
    col = rig.collector.text()[collector_before:]
    job = rig.job.text()[job_before:]
    col_said = col.count("sweep failed")
    job_said = job.count("txnwatch stream: Kafka does not answer")
    resumed = job.count("txnwatch stream: Kafka answers again")
    job_lines = [line for line in job.splitlines() if line.startswith("txnwatch stream:")]
    print(
        f"collector: said {col_said} time(s), first successful sweep {collector_s:.1f}s after the brokers were "
        f"back; job: said {job_said} time(s), resumed {resumed} time(s) {job_lines}; an orphan made after the "
        f"outage was detected in {detected_s:.0f}s"
    )
    assert col_said == 1, col
    assert job_said == 1 and resumed == 1, job[-3000:]
    # The orphan still hangs: its page (the series, with the same labels) is still up, current.
    after = scrape(url, pre["topic"])
    assert after.stale == 0 and after.labels == before.labels, (before, after)
