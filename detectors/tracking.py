"""How the reconcile stages move their state, pure (no Spark, no clock): stage 1 (`advance_owners`) turns
coordinator records into producer-id facts; stage 2 (`BucketState`) keeps the views and open transactions, judges
them and emits verdicts and candidates. Rows are plain tuples in the column orders below, which the job's Spark
schemas follow. Why: docs/streaming.md, "The stateful stages", and docs/detection.md, section 4.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from detectors.abort import plan_abort
from detectors.began import Mark, carried_marks, first_began_after, merged_marks, thinned, without_marks
from detectors.contract import OWNING_STATES, TRANSACTION_LOG_TOPIC
from detectors.currency import CurrencyState, ViewCurrency, coordinator_partition
from detectors.lateness import age_ms
from detectors.models import (
    AbortCandidate,
    AuditOutcome,
    AuditRecord,
    CandidateStatus,
    CoordinatorRecord,
    CoordinatorState,
    DetectionLimits,
    HangingReason,
    PartitionSnapshot,
    VerdictKind,
    WithheldReason,
    first_batch_epoch,
    open_since_ms,
)
from detectors.rules import (
    CoordFacts,
    Decision,
    TxnFacts,
    build_verdict,
    judge_view,
    leader_kept,
    two_phase_commit,
)

# ------------------------------------------------------------------------------------------- stage 1

# Stage 1's input columns (the job's `coordinator_rows`); the stage reads `bucket` as its key.
STAGE1_INPUT_COLUMNS = (
    "bucket",
    "transactional_id",
    "producer_id",
    "previous_producer_id",
    "next_producer_id",
    "tombstone",
    "last_update_timestamp_ms",
    "source_offset",
    "record_json",  # the whole CoordinatorRecord as JSON, built by Spark
    "state",  # the record's state (CoordinatorState value; None for a tombstone or a row that did not decode)
    # where the row was read: every row, also one that did not decode (its record fields are null but the
    # transactional id its key names, if the key decodes), so the view's progress through the coordinator topic
    # is known, and which ids it may miss a record of (detectors/currency.py, `advance_undecodable`)
    "read_topic",
    "read_partition",
    "read_offset",
    # null when the row's offset is the one after the row read before it; else that row's offset (-1 for the
    # reader's first row of the batch): a gap, records compaction removed (`read_facts`)
    "read_after",
)

# Stage 1's output: a fact about a producer id (streaming.reconcile.FACT_SCHEMA has these names).
FACT_COLUMNS = (
    "producer_id",
    # "view" | "retired" | "applied" (progress through a coordinator topic: producer_id -1,
    # transactional_id = the topic, record_json = {partition: next offset}, sent to every stage-2 bucket) |
    # "read" (where the reading broke: {partition: [[before, offset]]}, fact_time_ms = when read; `read_facts`)
    "fact",
    "transactional_id",
    "record_json",  # CoordinatorRecord JSON (view)
    "fact_time_ms",  # record update time, or when retired
    # offset of the record in its coordinator topic partition (all records of a transactional id, hence of
    # its producer ids, are in one partition): what orders the facts of a producer id; -1 when unknown
    "log_offset",
)
Fact = tuple[int, str, str, str | None, int, int]  # FACT_COLUMNS


class Owner(NamedTuple):
    """Stage 1's state per transactional id: the producer id it owns and the newest log offset applied.

    `undecodable` was added after v0.1.0 (a stored 2-tuple loads with its default): per coordinator topic, the
    read offset of the id's newest record that did not decode and that no decodable record has superseded yet
    (`advance_undecodable`). An id kept only for that owns no producer id (-1).
    """

    producer_id: int  # -1: owns none
    source_offset: int
    undecodable: tuple[tuple[str, int], ...] = ()
    # When the id's newest record is PrepareCommit/PrepareAbort: (producer id, epoch, its partitions as JSON), to
    # carry over to the Complete record after it (`with_prepared`). Added after v0.1.0; absent (None) before.
    prepared: tuple[int, int, str] | None = None


class CoordinatorRow(NamedTuple):
    transactional_id: str
    producer_id: int
    previous_producer_id: int
    next_producer_id: int
    tombstone: bool
    last_update_timestamp_ms: int
    source_offset: int
    record_json: str
    state: str | None = None


def advance_owners(owners: dict[str, Owner], records: Iterable[CoordinatorRow]) -> list[Fact]:
    """Apply coordinator records to `owners` (in place); the producer-id facts they imply, newest per id.

    Records of one transactional id apply in log order (their offset; never their timestamps); a record at or
    below the offset already applied is a replay and changes nothing (the log is ordered per transactional id).
    `source_offset` < 0 (the DescribeTransactions fallback has no offsets) always applies. Each fact carries the
    offset of the record it comes from, so stage 2 orders by the log too. Plain tuples in CoordinatorRow's order
    are fine (the processor passes them: a NamedTuple per row costs as much as the rule).
    """
    facts: list[Fact] = []
    by_id: dict[str, list[CoordinatorRow]] = {}
    for r in records:
        rows_of_id = by_id.get(r[0])
        if rows_of_id is None:
            by_id[r[0]] = [r]
        else:
            rows_of_id.append(r)
    for transactional_id, rows in by_id.items():
        if len(rows) > 1:
            rows.sort(key=_by_offset)
        current = owners.get(transactional_id)
        owned = current[0] if current and current[0] >= 0 else None
        last_offset = current[1] if current else -1
        prepared = current.prepared if current is not None and len(current) > 3 else None
        per_producer: dict[int, Fact] = {}
        listed: dict[int, set[tuple[str, int]]] = {}  # per producer id: what its Prepare records listed
        # per producer id: the transactions that completed in this batch (`FoldedCompletion` fields), and the
        # Prepare record read last (its state, epoch, start, time, partitions), until a record follows it
        completions: dict[int, list[dict[str, Any]]] = {}
        decided: tuple[int, dict[str, Any]] | None = None
        marks: dict[int, list[Mark]] = {}  # per producer id: when the transactions folded into its fact began
        for _, producer_id, previous_id, next_id, tombstone, updated_ms, offset, record_json, *more in rows:
            if 0 <= offset <= last_offset:
                continue
            last_offset = max(last_offset, offset)
            carried = carried_marks(record_json)
            if carried:
                marks.setdefault(producer_id, []).extend(carried)
            state = more[0] if more else None
            if state in _COMPLETING:
                record_json = with_prepared(record_json, producer_id, prepared)
            if decided is not None:  # a record after a Prepare: its transaction completed by now
                completions.setdefault(decided[0], []).append(completion(decided[1], updated_ms))
                decided = None
            elif state in _COMPLETING and producer_id == (prepared[0] if prepared else None):
                completions.setdefault(producer_id, []).append(completed_here(record_json))
            if state in _PREPARING:
                d = json.loads(record_json)
                prepared = prepare_of(producer_id, d)
                listed.setdefault(producer_id, set()).update(_partition_set(d.get("partitions")))
                decided = (producer_id, d)
            else:
                prepared = None
            if tombstone:
                if owned is not None:
                    per_producer[owned] = (owned, "retired", transactional_id, None, updated_ms, offset)
                owned = None
                continue
            if owned is not None and owned != producer_id:
                # The id moved to a new producer id (epoch overflow, or a new producer after expiry). A record
                # that still names the old one (previous/next producer id) remains its view.
                if owned in (previous_id, next_id):
                    per_producer[owned] = (owned, "view", transactional_id, record_json, updated_ms, offset)
                else:
                    per_producer[owned] = (owned, "retired", transactional_id, None, updated_ms, offset)
            owned = producer_id
            per_producer[owned] = (owned, "view", transactional_id, record_json, updated_ms, offset)
        undecodable = current.undecodable if current else ()
        if owned is None and not undecodable:
            owners.pop(transactional_id, None)
        else:
            owners[transactional_id] = Owner(
                -1 if owned is None else owned, last_offset, undecodable, prepared
            )
        for producer_id, (pid, kind, tid, folded_json, fact_ms, fact_offset) in per_producer.items():
            if folded_json is not None and producer_id in listed:
                folded_json = with_listed_since(
                    folded_json, listed[producer_id], completions.get(producer_id, ())
                )
            if folded_json is not None and producer_id in marks:
                merged = thinned(sorted(marks[producer_id], key=lambda m: m[1]))
                if merged != carried_marks(folded_json):
                    folded_json = merged_marks(folded_json, merged)
            facts.append((pid, kind, tid, folded_json, fact_ms, fact_offset))
    return facts


def completion(prepare: dict[str, Any], next_ms: int) -> dict[str, Any]:
    """A `FoldedCompletion` of a Prepare record followed by another record of its id (Kafka writes none until
    the transaction completed), whose Complete record the decoder dropped."""
    commit = prepare["state"] == CoordinatorState.PREPARE_COMMIT.value
    return {
        "state": (CoordinatorState.COMPLETE_COMMIT if commit else CoordinatorState.COMPLETE_ABORT).value,
        "producer_epoch": prepare["producer_epoch"],
        "start_timestamp_ms": prepare["start_timestamp_ms"],
        "decided_ms": prepare["last_update_timestamp_ms"],
        # a coordinator that moved to a broker whose clock is behind stamps the next record older
        "completed_by_ms": max(next_ms, prepare["last_update_timestamp_ms"]),
        "partitions": prepare.get("partitions") or [],
    }


def completed_here(record_json: str) -> dict[str, Any]:
    """A `FoldedCompletion` of a Complete record read with its Prepare's partitions (`with_prepared`), its
    Prepare read in an earlier batch."""
    d = json.loads(record_json)
    return {
        "state": d["state"],
        "producer_epoch": d["producer_epoch"],
        "start_timestamp_ms": d["start_timestamp_ms"],
        "decided_ms": d["last_update_timestamp_ms"],
        "completed_by_ms": d["last_update_timestamp_ms"],
        "partitions": d.get("prepared_partitions") or [],
    }


def completion_after(d: dict[str, Any], record_json: str, tp: tuple[str, int], after_ms: int) -> str | None:
    """The first completion in a coordinator record (parsed `d`, its JSON `record_json`) whose Prepare listed
    `tp` and that was decided after `after_ms`: among those stage 1 folded into it (`completed_since`, as a
    Complete record of its own), then the record itself; None if there is none."""
    for c in d.get("completed_since") or ():
        if c["decided_ms"] > after_ms and tp in _partition_set(c["partitions"]):
            folded = d | {
                "state": c["state"],
                "producer_epoch": c["producer_epoch"],
                "start_timestamp_ms": c["start_timestamp_ms"],
                "last_update_timestamp_ms": c["completed_by_ms"],
                "partitions": [],
                "prepared_partitions": c["partitions"],
                "listed_since": None,
                "completed_since": None,
            }
            return json.dumps(folded)
    if (
        d.get("state") in _COMPLETING
        and d["last_update_timestamp_ms"] > after_ms
        and tp in _partition_set(d.get("prepared_partitions"))
    ):
        return record_json
    return None


def with_listed_since(
    record_json: str, listed: set[tuple[str, int]], completions: Sequence[dict[str, Any]] = ()
) -> str:
    """The record with `listed_since`: the partitions the Prepare records of its producer id that stage 1 folded
    into it listed, where they are more than it lists itself (stage 2 must not miss a marker a folded
    transaction wrote: `BucketState.track_moved_on`), and `completed_since`: those of the `completions` that
    listed more (a lost-marker proof rests on them). Unchanged otherwise, so a producer that always writes the
    same partitions costs no JSON round trip."""
    d = json.loads(record_json)
    own = _partition_set(d.get("partitions")) | _partition_set(d.get("prepared_partitions"))
    if listed <= own:
        return record_json
    d["listed_since"] = [{"topic": t, "partition": p} for t, p in sorted(listed | own)]
    more = [c for c in completions if not _partition_set(c["partitions"]) <= own]
    if more:
        d["completed_since"] = more
    return json.dumps(d)


_PREPARING = frozenset({CoordinatorState.PREPARE_COMMIT.value, CoordinatorState.PREPARE_ABORT.value})
_COMPLETING = frozenset({CoordinatorState.COMPLETE_COMMIT.value, CoordinatorState.COMPLETE_ABORT.value})


def prepare_of(producer_id: int, d: dict[str, Any]) -> tuple[int, int, str]:
    """What a PrepareCommit/PrepareAbort record (parsed) says its Complete record needs: producer id, epoch,
    partitions."""
    return (producer_id, d["producer_epoch"], json.dumps(d.get("partitions") or []))


def with_prepared(record_json: str, producer_id: int, prepared: tuple[int, int, str] | None) -> str:
    """A CompleteCommit/CompleteAbort record with `prepared_partitions`: those of the Prepare record just before
    it in the id's log, when that one is of the same producer id and epoch (Kafka's Complete record lists no
    partitions; the Prepare listed the ones the coordinator sent markers to). Unchanged (None: not read)
    otherwise. Once a transaction, so the JSON round trip costs little."""
    if prepared is None or prepared[0] != producer_id:
        return record_json
    d = json.loads(record_json)
    if d.get("producer_epoch") != prepared[1]:
        return record_json
    d["prepared_partitions"] = json.loads(prepared[2])
    return json.dumps(d)


def _by_offset(r: CoordinatorRow) -> int:
    return r[6]


def applied_facts(topics: Sequence[str], partitions: Sequence[int], offsets: Sequence[int]) -> list[Fact]:
    """How far this batch's rows reached in each coordinator topic partition: one "applied" fact per topic,
    {partition: offset after the last row} as JSON. Every stage-2 bucket gets it (with the collector's positions
    it tells when the view is current)."""
    reached: dict[str, dict[int, int]] = {}
    for topic, partition, offset in zip(topics, partitions, offsets, strict=True):
        if topic is None:
            continue
        per_topic = reached.setdefault(topic, {})
        if offset + 1 > per_topic.get(partition, 0):
            per_topic[partition] = offset + 1
    return [(-1, "applied", topic, json.dumps(ends), 0, -1) for topic, ends in reached.items()]


def read_facts(
    topics: Sequence[str | None],
    partitions: Sequence[int | None],
    offsets: Sequence[int | None],
    read_after: Sequence[int | None],
    read_at_ms: int,
) -> list[Fact]:
    """Where this batch's reading of each coordinator topic partition did not run on from the row before: one
    "read" fact per topic, {partition: [[offset read before (-1: the reader's first row), offset]]} as JSON, at
    `read_at_ms` (the reader's clock, after the fetch). Every stage-2 bucket gets it and merges the batch's facts
    before its "applied" ones (`detectors.currency.ViewCurrency.read`)."""
    found: dict[str, dict[int, list[tuple[int, int]]]] = {}
    for topic, partition, offset, before in zip(topics, partitions, offsets, read_after, strict=True):
        if before is not None and topic is not None and partition is not None and offset is not None:
            found.setdefault(topic, {}).setdefault(partition, []).append((before, offset))
    return [(-1, "read", topic, json.dumps(per), read_at_ms, -1) for topic, per in found.items()]


def advance_undecodable(
    owners: dict[str, Owner],
    transactional_ids: Sequence[str | None],
    producer_ids: Sequence[int | None],
    topics: Sequence[str | None],
    partitions: Sequence[int | None],
    offsets: Sequence[int | None],
) -> list[Fact]:
    """Which ids' newest record did not decode, and which a decodable record freed again (`owners` in place).

    A row read with no producer id did not decode: its content is lost, though the view has read past it. Its
    key may still name the transactional id; otherwise any id of its partition could be the one. Per topic,
    one "undecodable" fact for every stage-2 bucket, as JSON: `records` (how many did not decode), `tainted`
    ([id, read offset]: the id's newest record did not decode), `cleared` ([id, read offset]: a decodable record
    of a tainted id, later in the log) and `keyless` ([partition, read offset]). Rows in the processor's columns.
    """
    if None not in producer_ids and not _any_pending(owners, transactional_ids):
        return []  # the common case, kept cheap: every row decoded and no id of the batch has a record pending
    bad_rows: dict[str, int] = {}
    keyless: dict[str, list[tuple[int, int]]] = {}
    newest: dict[tuple[str, str], tuple[int, int]] = {}  # (topic, id) -> (newest bad offset, newest good)
    for tid, pid, topic, partition, offset in zip(
        transactional_ids, producer_ids, topics, partitions, offsets, strict=True
    ):
        if topic is None or partition is None or offset is None:
            continue
        if pid is None:
            bad_rows[topic] = bad_rows.get(topic, 0) + 1
            if tid is None:
                keyless.setdefault(topic, []).append((partition, offset))
                continue
        elif tid is None:
            continue
        bad, good = newest.get((topic, tid), (-1, -1))
        newest[(topic, tid)] = (max(bad, offset), good) if pid is None else (bad, max(good, offset))
    changes: dict[str, dict[str, list[tuple[str, int]]]] = {}
    for (topic, tid), (bad, good) in newest.items():
        current = owners.get(tid)
        taints = dict(current.undecodable) if current else {}
        before = taints.get(topic, -1)
        if bad < 0 and before < 0:
            continue  # the common case: a decodable record of an id with nothing pending
        bad = max(bad, before)
        if bad >= good:  # only a later record supersedes (the same offset is the same record, read again)
            taints[topic] = bad
            if bad != before:
                changes.setdefault(topic, {}).setdefault("tainted", []).append((tid, bad))
        else:
            taints.pop(topic, None)
            if before >= 0:
                changes.setdefault(topic, {}).setdefault("cleared", []).append((tid, good))
        kept = tuple(sorted(taints.items()))
        if current is not None:
            if kept or current.producer_id >= 0:
                owners[tid] = current._replace(undecodable=kept)
            else:
                del owners[tid]
        elif kept:
            owners[tid] = Owner(-1, -1, kept)
    facts: list[Fact] = []
    for topic in sorted(set(bad_rows) | set(changes)):
        body = {
            "records": bad_rows.get(topic, 0),
            **changes.get(topic, {}),
            "keyless": keyless.get(topic, []),
        }
        facts.append((-1, "undecodable", topic, json.dumps(body), 0, -1))
    return facts


def _any_pending(owners: dict[str, Owner], transactional_ids: Sequence[str | None]) -> bool:
    # A plain loop over map(): per row, it costs about two thirds of a generator expression (measured).
    for owner in map(owners.get, transactional_ids):  # type: ignore[arg-type]  # noqa: SIM110  (None finds nothing)
        if owner is not None and owner[2]:
            return True
    return False


def run_ends(
    transactional_ids: list[Any],
    producer_ids: list[Any],
    tombstones: list[Any],
    states: list[Any] | None = None,
    partitions: list[Any] | None = None,
) -> list[bool]:
    """Which records (in log order) stage 1 needs: the first and the last of each run of records of one
    transactional id with one producer id, every tombstone, and every row that did not decode (id None); with
    `states`, also the run's newest PrepareCommit/PrepareAbort that a Complete record follows directly (stage 1
    carries its partitions over to the Complete record: `with_prepared`); with `partitions`, also every Prepare whose
    partitions differ from the run's next Prepare, and the Complete right after it, so no partition a folded
    transaction listed is lost. Why the others can go: docs/streaming.md, "Stage 1"; a test holds stage 1's output
    equal with and without it.
    """
    keep = [True] * len(transactional_ids)
    # transactional id -> (producer id, first index, last index, the Prepare kept before a Complete, -1 none)
    run: dict[str, tuple[int, int, int, int]] = {}
    # with `partitions`: per transactional id, its run's latest Prepare (index, partitions); a Prepare whose
    # partitions differ from the next one's is pinned (kept), so every set of partitions the run listed is kept
    prepares: dict[str, tuple[int, frozenset[tuple[str, int]]]] = {}
    pinned: list[int] = []
    completes: dict[int, int] = {}  # a Prepare's index -> the Complete right after it in its run
    for i, (tid, pid, tombstone) in enumerate(zip(transactional_ids, producer_ids, tombstones, strict=True)):
        if tid is None:
            continue
        if tombstone:
            run.pop(tid, None)
            prepares.pop(tid, None)
            continue
        current = run.get(tid)
        if current is not None and current[0] == pid:
            _, first, last, prepare = current
            if states is not None and states[last] in _PREPARING and states[i] in _COMPLETING:
                completes[last] = i
            if last != first:
                if states is not None and states[last] in _PREPARING and states[i] in _COMPLETING:
                    if prepare >= 0 and prepare != first:
                        keep[prepare] = False  # an older transaction's Prepare
                    prepare = last
                else:
                    keep[last] = False  # a middle record of the run
            run[tid] = (pid, first, i, prepare)
        else:
            run[tid] = (pid, i, i, -1)
            prepares.pop(tid, None)
        if partitions is not None and states is not None and states[i] in _PREPARING:
            mine = _partition_set(partitions[i])
            before = prepares.get(tid)
            if before is not None and before[1] != mine:
                pinned.append(before[0])
            prepares[tid] = (i, mine)
    for i in pinned:
        keep[i] = True
        if i in completes:  # its completion too (`advance_owners`' `completed_since`)
            keep[completes[i]] = True
    return keep


def _partition_set(partitions: Any) -> frozenset[tuple[str, int]]:
    return frozenset((p["topic"], p["partition"]) for p in partitions or ())


# ------------------------------------------------------------------------------------------- stage 2

# Both inputs of stage 2 in one schema: coordinator facts (fact != "open") and open transactions.
STAGE2_INPUT_COLUMNS = (
    "bucket",
    "producer_id",
    "fact",
    "transactional_id",
    "record_json",
    "fact_time_ms",
    "log_offset",  # a view or retired fact's place in the coordinator log (FACT_COLUMNS); null otherwise
    # open transactions: the partition, its one-transaction PartitionSnapshot JSON, and the columns the
    # decision needs, so the hot path never parses the JSON
    "topic",
    "partition",
    "snapshot_json",
    "observed_at_ms",
    "leader",
    "start_offset",
    "producer_epoch",
    "start_batch_producer_epoch",
    "start_timestamp_ms",
    "last_timestamp_ms",
    "opened_after_ms",
    "seen_open_ms",
    "max_transaction_timeout_ms",
    "lso_lag",
    # the start batch's leader epoch and the report's (`rules.leader_kept`); null when unknown
    "start_batch_leader_epoch",
    "leader_epoch",
)


class EventField(NamedTuple):
    """One column of stage 2's output: its name, its value type ("string", "long" or "boolean": a Spark type
    by name, so this module stays free of Spark) and whether it may be null."""

    name: str
    type: Literal["string", "long", "boolean"]
    nullable: bool


# Stage 2's output, declared once: streaming.reconcile.EVENT_SCHEMA is built from it, the driver's EventRow
# (streaming/sinks.py) has these fields, and the tuples stage 2 emits follow EVENT_COLUMNS.
EVENT_FIELDS = (
    EventField("event", "string", False),  # VERDICT | OPENED | RESOLVED | WITHDRAWN | GONE | VIEW
    EventField("producer_id", "long", False),
    EventField("topic", "string", False),
    EventField("partition", "long", False),
    EventField("leader", "long", True),
    EventField("start_offset", "long", False),
    EventField("kind", "string", True),
    EventField("reason", "string", True),
    EventField("age_ms", "long", True),
    EventField("lso_lag", "long", True),
    # set when the verdict is new or changed (VERDICT; not for plain OPEN), and on OPENED / RESOLVED / WITHDRAWN
    EventField("explanation", "string", True),
    EventField("candidate_id", "string", True),
    EventField(
        "payload", "string", True
    ),  # AbortCandidate JSON for OPENED / RESOLVED / WITHDRAWN; VIEW's lag
    EventField("event_time_ms", "long", False),
    EventField("withheld", "string", True),  # UNCONFIRMED: why the HANGING proof was withheld
    # VERDICT, OPENED, RESOLVED: the coordinator owns it as KIP-939 2PC (rules.two_phase_commit)
    EventField("two_phase_commit", "boolean", True),
    # VERDICT, OPENED, RESOLVED, WITHDRAWN: the transactional id of the coordinator record the verdict was judged
    # against, None without one; the driver's per-partition series name it, so a page says whose transaction it is
    EventField("transactional_id", "string", True),
)
EVENT_COLUMNS = tuple(f.name for f in EVENT_FIELDS)
Event = tuple[Any, ...]  # EVENT_COLUMNS


@dataclass(frozen=True)
class ReconcileConfig:
    """What stage 2 needs besides the detection limits; shipped to executors with the processor."""

    limits: DetectionLimits
    expire_after_ms: int  # forget an open transaction not confirmed by a snapshot for this long
    view_ttl_ms: (
        int  # forget a coordinator view not updated for this long (bounds state of dead producer ids)
    )
    bootstrap: str | None = None  # for the kafka-transactions.sh line in candidates
    command_config: str | None = None
    # The coordinator topics the views are built from, whose currency the collector's positions measure.
    transaction_log_topic: str | None = TRANSACTION_LOG_TOPIC
    coordinator_state_topic: str | None = None  # the describe fallback's topic
    # A new one every time the job starts (streaming/job.py): stage 2 emits a VERDICT only when it changes
    # (`VerdictNews`), so a driver that starts empty is told every verdict again once, by each bucket at its first
    # batch of the run (streaming/reconcile.py keeps the run each bucket last told).
    run_id: str = ""

    def view_currency(self, state: CurrencyState | None = None) -> ViewCurrency:
        """The bookkeeping of how current the view is, restored from `state` (a bucket's stored one)."""
        others = [self.coordinator_state_topic] if self.coordinator_state_topic else []
        return ViewCurrency(
            self.transaction_log_topic, others, state, clock_skew_ms=self.limits.clock_skew_ms
        )


class View(NamedTuple):
    """The coordinator's latest word on a producer id: its record, or when it was retired.

    The last two fields were added after v0.1.0: a view stored before has 4 fields and loads with their
    defaults (position unknown, progress not worked out yet).
    """

    record_json: str | None
    retired_at_ms: int | None
    fact_time_ms: int  # the record's update time (coordinator clock), or when retired: evidence, never order
    updated_ms: int  # processing time of the last update (the TTL counts from it)
    log_offset: int = -1  # where the record (or the retirement) is in the coordinator log; -1 unknown
    # The record is Ongoing/Prepare*: never forgotten (`kept_past_ttl`). Worked out when the view is applied;
    # None only in a view stored by a release that worked it out lazily.
    in_progress: bool | None = None


def newer_in_log(offset: int, stored_offset: int) -> bool:
    """Whether a fact at coordinator-log `offset` supersedes the view stored from `stored_offset`.

    The offset within one `__transaction_state` partition is the coordinator's own order of its writes, and every
    record of a producer id is in one partition (its transactional id's). A coordinator that moves to another
    broker loads the partition and appends to the same log, so offsets keep increasing across moves. Equal
    offsets are the same record again. An unknown position (< 0: the describe fallback, or a view stored before
    positions were kept) cannot be compared: the fact applies, in the order stage 1 delivered it.
    """
    return offset < 0 or stored_offset < 0 or offset > stored_offset


def in_progress(record_json: str | None) -> bool:
    """The record says the coordinator still owns a transaction (Ongoing, Prepare*): the markers are to come."""
    if record_json is None:
        return False
    state = json.loads(record_json).get("state")
    return state is not None and CoordinatorState(state) in OWNING_STATES


def kept_past_ttl(view: View, in_use: bool) -> bool:
    """Whether a view must outlive `view_ttl_ms`: its record says the coordinator still owns a transaction
    (Ongoing, Prepare*), or an open transaction of its producer id is tracked (`in_use`).

    Either way the view is evidence a verdict rests on: a forgotten view reads as "no transactional id owns
    it", and a transaction held open for longer than the TTL (a KIP-939 prepared one has no timeout) came back
    as HANGING no-coordinator-state. Every other view (the transaction is over: Empty, Complete*, or retired)
    is forgotten `view_ttl_ms` after it was last written, which bounds the state of producer ids nobody uses.
    """
    if in_use:
        return True
    return view.in_progress if view.in_progress is not None else in_progress(view.record_json)


class Views:
    """The coordinator views a batch touches: each read once from the state store (`load`, one round trip per
    producer id) on first use, and written back only when it changed or must move between the views kept past
    the TTL and the ones that expire (`BucketState.view_homes`). Without `load` (tests), `stored` is the whole
    store. Why not the whole bucket in memory: docs/streaming.md, "The stateful stages".
    """

    def __init__(
        self, stored: dict[int, View] | None = None, load: Callable[[int], View | None] | None = None
    ) -> None:
        self._cache: dict[int, View | None] = dict(stored or {})
        self._load = load
        self.changed: set[int] = set()

    def get(self, producer_id: int) -> View | None:
        if producer_id in self._cache:
            return self._cache[producer_id]
        view = self._load(producer_id) if self._load is not None else None
        self._cache[producer_id] = view
        return view

    def __getitem__(self, producer_id: int) -> View:
        view = self.get(producer_id)
        if view is None:
            raise KeyError(producer_id)
        return view

    def __setitem__(self, producer_id: int, view: View) -> None:
        self._cache[producer_id] = view
        self.changed.add(producer_id)

    def loaded(self) -> dict[int, View]:
        """The views read or written so far (all of them without `load`)."""
        return {pid: v for pid, v in self._cache.items() if v is not None}


class OpenEntry(NamedTuple):
    """An open transaction as the latest snapshot reported it, and what we concluded about it."""

    facts: TxnFacts  # first_seen_ms filled in
    snapshot_json: str  # one-transaction PartitionSnapshot (parsed only to explain or plan an abort)
    confirmed_ms: int  # observed_at of the newest snapshot that showed it open
    leader: int | None
    start_offset: int
    lso_lag: int | None
    candidate_json: str | None  # the AbortCandidate, once OPENED
    decided: tuple[str, str | None] | None  # (kind, reason) last emitted with an explanation
    # What the driver was last told of it (`VerdictNews`); None: nothing yet, or not in this run of the job
    # (`BucketState.announce_again`). Added after v0.1.0: an entry stored before loads with None, and is told.
    announced: tuple[Any, ...] | None = None
    # The earliest "opened after" bound any report gave (`earliest_sightings`); added after v0.2.0: None before.
    opened_after_ms: int | None = None
    # Where the record is in the transaction log (partition, offset) that showed the owner moved on
    # (`facts.moved_on_ms`, `BucketState.track_moved_on`); added after v0.2.0: None before.
    moved_on_at: tuple[int, int] | None = None
    # The first Complete* record of the producer id whose Prepare listed the partition, written after the
    # transaction was seen open (its JSON and log offset, `BucketState.track_moved_on`): the lost-marker proof
    # rests on it, whatever the owner does next. Added after v0.2.0: None before.
    marker_record: tuple[str, int] | None = None


OpenKey = tuple[int, str, int]  # producer id, topic, partition


def stored_open_entry(facts: tuple[Any, ...], *rest: Any) -> OpenEntry:
    """An OpenEntry from the plain tuples a state store keeps (its facts come back as TxnFacts)."""
    return OpenEntry(TxnFacts(*facts), *rest)


_SWEEP_ID = re.compile(r'"sweep_id":"([^"\\]*)"')


def report_sweep_id(snapshot_json: str) -> str:
    """The sweep id of a stored one-transaction snapshot, without parsing it ("" if it has none)."""
    found = _SWEEP_ID.search(snapshot_json)
    return found.group(1) if found else ""


def coord_facts_from_json(record_json: str) -> CoordFacts:
    """`rules.coord_facts(CoordinatorRecord.model_validate_json(s))` without pydantic (a test holds them equal)."""
    return _coord_facts(json.loads(record_json))


def _coord_facts(d: dict[str, Any]) -> CoordFacts:
    state = d.get("state")
    return CoordFacts(
        d["producer_id"],
        d["producer_epoch"],
        d.get("previous_producer_id", -1),
        d.get("next_producer_id", -1),
        d.get("client_transaction_version", 0),
        d["transaction_timeout_ms"],
        None if d.get("tombstone") or state is None else CoordinatorState(state),
        frozenset((p["topic"], p["partition"]) for p in d.get("partitions") or ()),
        d["last_update_timestamp_ms"],
        d["start_timestamp_ms"],
        None
        if (prepared := d.get("prepared_partitions")) is None
        else frozenset((p["topic"], p["partition"]) for p in prepared),
    )


class OpenRow(NamedTuple):
    """An open-transaction input row of stage 2 (STAGE2_INPUT_COLUMNS from `topic` on, with the producer id)."""

    producer_id: int
    topic: str
    partition: int
    snapshot_json: str
    observed_at_ms: int
    leader: int | None
    start_offset: int
    producer_epoch: int
    start_batch_producer_epoch: int | None
    start_timestamp_ms: int | None
    last_timestamp_ms: int
    opened_after_ms: int | None
    seen_open_ms: int | None
    max_transaction_timeout_ms: int | None
    lso_lag: int | None
    start_batch_leader_epoch: int | None = None
    leader_epoch: int | None = None


def open_entry(
    r: OpenRow,
    first_seen_ms: int | None,
    candidate_json: str | None,
    decided: tuple[str, str | None] | None,
    announced: tuple[Any, ...] | None = None,
) -> OpenEntry:
    """The state of an open transaction as of row `r` (first seen on the collector's clock, like the rest).

    Its facts are `rules.txn_facts` on plain values (tests/unit/test_tracking.py holds them equal).
    """
    facts = TxnFacts(
        r.topic,
        r.partition,
        r.producer_id,
        first_batch_epoch(r.start_batch_producer_epoch, r.producer_epoch),
        open_since_ms(r.start_timestamp_ms, r.last_timestamp_ms, r.opened_after_ms, r.seen_open_ms),
        r.observed_at_ms,
        r.max_transaction_timeout_ms,
        first_seen_ms,
        r.seen_open_ms,
        None,
        leader_kept(r.start_batch_leader_epoch, r.leader_epoch),
    )
    return OpenEntry(
        facts,
        r.snapshot_json,
        r.observed_at_ms,
        r.leader,
        r.start_offset,
        r.lso_lag,
        candidate_json,
        decided,
        announced,
        r.opened_after_ms,
    )


def _earliest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def earliest_sightings(row: OpenRow, entry: OpenEntry) -> OpenRow:
    """`row` with the sightings of the same open transaction already tracked: the earliest wins.

    A collector that restarted, or a stale replica's answer without the transaction, starts its sightings again
    (seen open at its next report, opened after the stale answer): merely younger evidence, which must not undo
    a proof made on the older one (docs/detection.md, "Sightings")."""
    seen = _earliest(entry.facts.seen_open_ms, row.seen_open_ms)
    after = entry.opened_after_ms if entry.opened_after_ms is not None else row.opened_after_ms
    if seen is not None and after is not None and after >= seen:
        after = None  # bounds from two collectors that do not fit together: keep the sighting, drop the bound
    if seen == row.seen_open_ms and after == row.opened_after_ms:
        return row
    snapshot = PartitionSnapshot.model_validate_json(row.snapshot_json)
    txn = snapshot.open_transactions[0].model_copy(update={"seen_open_ms": seen, "opened_after_ms": after})
    snapshot = snapshot.model_copy(update={"open_transactions": (txn,)})
    return row._replace(seen_open_ms=seen, opened_after_ms=after, snapshot_json=snapshot.model_dump_json())


class VerdictNews(NamedTuple):
    """What the driver reads of a VERDICT event (streaming/exporter.py `LiveState.apply_events`, the console in
    streaming/sinks.py), less what it works out itself (the age, the explanation): stage 2 emits a VERDICT only when
    this differs from what it last emitted for the open transaction (`OpenEntry.announced`). Why `lso_lag` is kept
    although it moves by itself: docs/streaming.md, "Stage 2".
    """

    kind: str
    reason: str | None
    withheld: str | None
    candidate_id: str | None
    two_phase_commit: bool
    transactional_id: str | None
    leader: int | None
    start_offset: int
    lso_lag: int | None
    open_since_ms: int


WITHDRAWN_BY = "txnwatch-stream"


def withdrawal_audit(candidate: AbortCandidate) -> AuditRecord:
    """The audit record of a WITHDRAWN candidate (`<prefix>.audit`, beside the abort attempts): on-call who saw
    it proposed finds when and why the job took the proposal back."""
    if candidate.status is not CandidateStatus.WITHDRAWN or candidate.resolved_at_ms is None:
        raise ValueError(f"candidate {candidate.candidate_id} is {candidate.status.value}, not WITHDRAWN")
    return AuditRecord(
        **candidate.audit_fields(),
        audit_id=f"withdrawn-{candidate.candidate_id}-{candidate.resolved_at_ms}",
        actor=WITHDRAWN_BY,
        at_ms=candidate.resolved_at_ms,
        execute=False,
        outcome=AuditOutcome.WITHDRAWN,
        message=f"withdrawn by the streaming job: {candidate.withdrawn_reason}",
    )


class BucketState:
    """Stage 2's state of one bucket and the rules that move it (pure: time comes in as arguments)."""

    def __init__(
        self,
        config: ReconcileConfig,
        views: Views | dict[int, View],
        opens: dict[OpenKey, OpenEntry],
        currency: ViewCurrency | None = None,
    ) -> None:
        self.config = config
        self.views = views if isinstance(views, Views) else Views(views)
        self.opens = opens
        # which open transactions each producer id has: a coordinator fact is weighed against them
        self._keys_of: dict[int, set[OpenKey]] = {}
        for key in opens:
            self._keys_of.setdefault(key[0], set()).add(key)
        # which producer ids had an open transaction tracked as loaded: whose views may have to move
        self._in_use_at_load = {key[0] for key in opens}
        self.currency = currency if currency is not None else config.view_currency()
        self.opens_changed = False
        self.currency_changed = False
        self.undecodable_changed = False  # this batch changed which records did not decode: judge everything

    # -- input

    def apply_progress(self, topic: str, ends_json: str) -> None:
        """An "applied" fact: the view holds every record of `topic` below these offsets."""
        for partition, end in json.loads(ends_json).items():
            self.currency_changed |= self.currency.applied(topic, int(partition), end)

    def apply_reads(self, reads: Sequence[tuple[str, str, int]]) -> None:
        """The batch's "read" facts (topic, {partition: [break offsets]} JSON, read time), merged across the
        stage-1 buckets that sent them, before the batch's "applied" facts: the batch's first offset read is the
        smallest break of all of them."""
        merged: dict[tuple[str, int], tuple[list[tuple[int, int]], int]] = {}
        for topic, body_json, read_at_ms in reads:
            for partition, pairs in json.loads(body_json).items():
                key = (topic, int(partition))
                known, at = merged.get(key, ([], read_at_ms))
                merged[key] = (known + [(before, offset) for before, offset in pairs], max(at, read_at_ms))
        rewound = len(self.currency.rewound)
        for (topic, partition), (offsets, read_at_ms) in merged.items():
            self.currency_changed |= self.currency.read(topic, partition, offsets, read_at_ms)
        # A rewound partition re-judges everything, as a lost record does (a gap only limits later positions).
        self.undecodable_changed |= len(self.currency.rewound) > rewound

    def _record_after_report(self, producer_id: int, transactional_id: str | None, moment_ms: int) -> bool:
        """The coordinator record a HANGING proof weighed against the report at `moment_ms` was appended after
        that moment, by the transaction log's offsets (`ViewCurrency.appended_after`), although the stamps put it
        before: the collector's clock runs ahead. Only for records of the transaction log (the describe
        fallback's records carry no log offset)."""
        view = self.views.get(producer_id)
        if view is None or self.currency.transaction_log is None:
            return False
        if view.record_json is not None:
            partition, offset = self._record_position(view.record_json, view.log_offset)
        else:  # retired: by a record of the transaction log unless the fallback's topic is read too
            if self.config.coordinator_state_topic:
                return False
            partition, offset = self._log_partition(transactional_id), view.log_offset
        if partition < 0 or offset < 0:
            return False
        return self.currency.appended_after(partition, offset, moment_ms)

    def _ordered_by_offsets(
        self,
        producer_id: int,
        entry: OpenEntry,
        t: TxnFacts,
        c: CoordFacts,
        kept: tuple[str, int] | None,
        transactional_id: str | None,
    ) -> tuple[TxnFacts, CoordFacts]:
        """The facts with what orders records before the report by the transaction log's offsets
        (`detectors.rules.logged_before_report`): the log end of the owner's partition measured before the
        report's request, the weighed record's offset and the moved-on record's. Only for records of the
        transaction log; otherwise (the describe fallback, an unknown size or sweep) the proofs wait for the
        clocks as before."""
        partition = self._log_partition(transactional_id)
        if partition < 0:
            return t, c
        sweep_id = report_sweep_id(entry.snapshot_json)
        ends = self.currency.ends_before_report(sweep_id)
        end = None if ends is None else ends.get(partition)
        # Ordered proofs also need the view current as of the report by the same run's positions, not a clock.
        if end is None or not self.currency.current_for_report(sweep_id, partition):
            return t, c
        offset = kept[1] if kept is not None else self._record_offset(producer_id, partition)
        moved_on = entry.moved_on_at[1] if entry.moved_on_at and entry.moved_on_at[0] == partition else None
        return t._replace(log_end_before=end, moved_on_offset=moved_on), c._replace(log_offset=offset)

    def _record_offset(self, producer_id: int, partition: int) -> int | None:
        """Where the view's record of the producer id is in the transaction log partition `partition` (None: not
        known, or not a record of the transaction log)."""
        view = self.views.get(producer_id)
        if view is None or view.record_json is None:
            return None
        source_partition, offset = self._record_position(view.record_json, view.log_offset)
        return offset if source_partition == partition and offset >= 0 else None

    def _record_position(self, record_json: str, log_offset: int) -> tuple[int, int]:
        """(transaction log partition, offset) of a view's record; (-1, -1) for a record of the describe fallback.
        The job's records carry no provenance (streaming.rows.coordinator_rows): the fact's log offset says where,
        the transactional id which partition."""
        record = json.loads(record_json)
        if record.get("origin", "transaction-log") != "transaction-log":
            return -1, -1
        partition, offset = record.get("source_partition", -1), record.get("source_offset", -1)
        if offset < 0:
            partition, offset = self._log_partition(record.get("transactional_id")), log_offset
        return partition, offset

    def _log_partition(self, transactional_id: str | None) -> int:
        """The transaction log partition that holds the id's records (-1: no id, or the log's size unknown)."""
        newest = self.currency.newest.get(self.currency.transaction_log or "")
        if transactional_id is None or newest is None:
            return -1
        return coordinator_partition(transactional_id, newest.partitions)

    def _appended_after_report(self, at: tuple[int, int] | None, moment_ms: int) -> bool:
        """The record a proof rests on (its transaction log partition and offset: the owner moved on, or a kept
        completion) was appended after the report at `moment_ms`, by the transaction log's offsets, although its
        stamp puts it before: the collector's clock runs ahead."""
        if at is None or self.currency.transaction_log is None:
            return False
        partition, offset = at
        return partition >= 0 and offset >= 0 and self.currency.appended_after(partition, offset, moment_ms)

    def apply_undecodable(self, topic: str, body_json: str) -> None:
        """An "undecodable" fact (`advance_undecodable`): records of `topic` read whose content is lost, and ids
        a decodable record freed again. A change re-judges every open transaction (it is rare)."""
        body = json.loads(body_json)
        changed = self.currency.undecodable(
            topic,
            body.get("records", 0),
            [(tid, offset) for tid, offset in body.get("tainted", [])],
            [(tid, offset) for tid, offset in body.get("cleared", [])],
            [(partition, offset) for partition, offset in body.get("keyless", [])],
        )
        self.currency_changed |= changed
        self.undecodable_changed |= changed

    def apply_position(self, position_json: str) -> None:
        """A CoordinatorLogPosition the collector published (validated by Spark; see streaming/sources.py)."""
        p = json.loads(position_json)
        ends = {int(k): v for k, v in (p.get("end_offsets") or {}).items()}
        log_ends = {int(k): v for k, v in (p.get("log_end_offsets") or {}).items()}
        self.currency_changed |= self.currency.add_position(
            p["topic"], p["partitions"], p["as_of_ms"], ends, log_ends, p.get("sweep_id")
        )

    def view_event(self, now_ms: int) -> Event:
        """The view's lag, for the driver's metrics and console (one stage-2 bucket emits it)."""
        lag = self.currency.lag()
        return (
            ("VIEW", -1, "", -1, None, -1)
            + (None,) * 6
            + (json.dumps(lag._asdict()), now_ms, None, None, None)
        )

    def apply_fact(
        self,
        producer_id: int,
        fact: str,
        record_json: str | None,
        fact_time_ms: int,
        log_offset: int,
        now_ms: int,
    ) -> None:
        """A view or retired fact from stage 1, applied unless the view already holds a later record of the log.

        Never ordered by `fact_time_ms`: a coordinator that moved to a broker whose clock is behind (or an NTP
        step back) stamps its next record older than the last, and dropping it lost the partition it added.
        """
        current = self.views.get(producer_id)
        if current is not None and not newer_in_log(log_offset, current.log_offset):
            return  # the same record again, or an earlier one: changes nothing
        if fact == "retired":
            self.views[producer_id] = View(None, fact_time_ms, fact_time_ms, now_ms, log_offset, False)
        else:
            marks: list[Mark] = []
            if record_json is not None:
                record_json, marks = without_marks(record_json)
            # Whether the coordinator still owns the transaction decides where the view is kept (`kept_past_ttl`).
            self.views[producer_id] = View(
                record_json, None, fact_time_ms, now_ms, log_offset, in_progress(record_json)
            )
            if record_json is not None and producer_id in self._keys_of:
                self.track_moved_on(producer_id, record_json, log_offset, self._keys_of[producer_id], marks)

    def track_moved_on(
        self,
        producer_id: int,
        record_json: str,
        log_offset: int,
        keys: Iterable[OpenKey],
        marks: Sequence[Mark] = (),
    ) -> None:
        """Weigh a coordinator record of the producer id, applied in log order, against its open transactions: the
        first one of a transaction that began after an open transaction was seen open and does not list its partition
        shows the owner moved on (`rules.owner_moved_on`; the transactions folded into it, `marks`, count as its own);
        any record that lists the partition undoes that. Records of the transaction log only (`log_offset` >= 0): the
        describe fallback can miss a whole transaction between two polls (docs/detection.md, "`owner-moved-on`")."""
        if log_offset < 0:
            return
        d = json.loads(record_json)
        if d.get("producer_id") != producer_id:
            return
        prepared = _partition_set(d.get("prepared_partitions"))
        listed = _partition_set(d.get("partitions")) | prepared | _partition_set(d.get("listed_since"))
        start = d.get("start_timestamp_ms", -1)
        at = (self._log_partition(d.get("transactional_id")), log_offset)
        skew = self.config.limits.clock_skew_ms
        for key in keys:
            entry = self.opens[key]
            facts = entry.facts
            if (key[1], key[2]) in listed:
                if facts.moved_on_ms is not None:
                    entry = entry._replace(facts=facts._replace(moved_on_ms=None), moved_on_at=None)
                    self.opens[key] = entry
                    self.opens_changed = True
                if entry.marker_record is None and facts.seen_open_ms is not None:
                    kept = completion_after(d, record_json, (key[1], key[2]), facts.seen_open_ms + skew)
                    if kept is not None:
                        self.opens[key] = entry._replace(marker_record=(kept, log_offset))
                        self.opens_changed = True
            elif facts.moved_on_ms is None and facts.seen_open_ms is not None:
                began = first_began_after(marks, facts.seen_open_ms + skew)
                if began is not None and began[1] < log_offset:
                    moved = facts._replace(moved_on_ms=began[0])
                    self.opens[key] = entry._replace(facts=moved, moved_on_at=(at[0], began[1]))
                elif start > 0 and start - skew > facts.seen_open_ms:
                    moved = facts._replace(moved_on_ms=d["last_update_timestamp_ms"])
                    self.opens[key] = entry._replace(facts=moved, moved_on_at=at)
                else:
                    continue
                self.opens_changed = True

    def confirm_open(self, key: OpenKey, row: OpenRow, now_ms: int) -> list[Event]:
        """A snapshot showed a transaction open: remember it (keeping when we first saw it)."""
        existing = self.opens.get(key)
        events: list[Event] = []
        first_seen: int | None = row.observed_at_ms
        candidate_json: str | None = None
        decided: tuple[str, str | None] | None = None
        announced: tuple[Any, ...] | None = None
        if existing is not None:
            if existing.confirmed_ms > row.observed_at_ms:
                return []  # an older snapshot arriving late
            if existing.start_offset == row.start_offset:
                row = earliest_sightings(row, existing)
                first_seen = existing.facts.first_seen_ms
                candidate_json, decided = existing.candidate_json, existing.decided
                announced = existing.announced
            else:  # the transaction we knew ended and a new one began on the same partition
                events.extend(self._gone(key, existing, now_ms))
        # Confirmed as of the snapshot, not as of this batch: a backlog of old snapshots (after a restart or a
        # slow first batch) must not keep long-finished transactions alive.
        entry = open_entry(row, first_seen, candidate_json, decided, announced)
        known = existing is not None and existing.start_offset == row.start_offset
        if known and existing is not None:
            moved = entry.facts._replace(moved_on_ms=existing.facts.moved_on_ms)
            entry = entry._replace(
                facts=moved, moved_on_at=existing.moved_on_at, marker_record=existing.marker_record
            )
        self.opens[key] = entry
        self._keys_of.setdefault(key[0], set()).add(key)
        self.opens_changed = True
        if not known and entry.facts.seen_open_ms is not None:
            # A transaction new here: the producer id's newest record may already show the owner moved on (later
            # records are weighed as they are applied, `apply_fact`).
            view = self.views.get(key[0])
            if view is not None and view.record_json is not None:
                self.track_moved_on(key[0], view.record_json, view.log_offset, (key,))
        return events

    def announce_again(self) -> set[int]:
        """The driver is to be told every open transaction tracked again (the job started again, and the driver's
        live state is empty): forget what it was told; the producer ids to judge, every one tracked."""
        for key, entry in self.opens.items():
            if entry.announced is not None:
                self.opens[key] = entry._replace(announced=None)
                self.opens_changed = True
        return {key[0] for key in self.opens}

    # -- judging

    def evaluate(self, producer_ids: set[int], confirmed_now: set[OpenKey], now_ms: int) -> list[Event]:
        """Expire what no snapshot confirms any more; judge the open transactions of `producer_ids`."""
        events: list[Event] = []
        coordinator: dict[int, tuple[CoordFacts | None, int | None, str | None]] = {}
        recheck_withheld = self.currency_changed
        for key, entry in list(self.opens.items()):
            if key not in confirmed_now and entry.confirmed_ms + self.config.expire_after_ms <= now_ms:
                # No snapshot has confirmed it for too long: the collector stopped seeing it open. (A snapshot in
                # this very batch is the newest news we have, however late it arrived.)
                events.extend(self._forget(key, entry, now_ms))
                continue
            producer_id = key[0]
            # A withheld verdict is judged again whenever the view moved on, even with no news of its own.
            withheld = recheck_withheld and entry.decided is not None and entry.decided[0] == "UNCONFIRMED"
            if producer_id not in producer_ids and not withheld and not self.undecodable_changed:
                continue
            if producer_id not in coordinator:
                coordinator[producer_id] = self._coordinator(producer_id)
            events.extend(self._judge(key, entry, *coordinator[producer_id], now_ms))
        return events

    def _coordinator(self, producer_id: int) -> tuple[CoordFacts | None, int | None, str | None]:
        """The view of a producer id: its record (None if none or retired), when it was retired, and the
        transactional id the record is about (which coordinator partition must be current)."""
        view = self.views.get(producer_id)
        if view is None:
            return None, None, None
        if view.record_json is None:
            return None, view.retired_at_ms, None
        d = json.loads(view.record_json)
        return _coord_facts(d), None, d.get("transactional_id")

    def _judge(
        self,
        key: OpenKey,
        entry: OpenEntry,
        c: CoordFacts | None,
        retired_at_ms: int | None,
        transactional_id: str | None,
        now_ms: int,
    ) -> list[Event]:
        t = entry.facts
        # Judged as of the leader's report: ages and deadlines at observed_at, so input that arrives late (a
        # backlog) is not made to look older than it was. A HANGING proof needs the view of every coordinator
        # partition that could own the transaction to be current as of a report (judge, detectors/currency.py).
        view_current_ms = self.currency.current_as_of(transactional_id)
        # A record that could be about the owner was read but did not decode: the view is not complete, whatever
        # its currency says, so it proves nothing until a decodable record supersedes that one.
        undecodable = self.currency.undecodable_about(transactional_id)
        rewound = self.currency.rewound_about(transactional_id)
        # A completion whose marker should have closed it, written after it was seen open: the lost-marker proof
        # rests on that record, not on the newest, which a busy owner moves on every 100 ms (to a transaction
        # without the partition: owner-moved-on would propose an ABORT of a commit). Only while no transaction
        # of the owner lists the partition again: its coordinator may still close it.
        kept = entry.marker_record if not owned_by_coordinator(t, c) else None
        weighed = coord_facts_from_json(kept[0]) if kept is not None else c
        if weighed is not None:
            t, weighed = self._ordered_by_offsets(key[0], entry, t, weighed, kept, transactional_id)
        decision = judge_view(
            t,
            weighed,
            t.observed_at_ms,
            self.config.limits,
            view_current_ms=None if undecodable or rewound else view_current_ms,
            retired_at_ms=retired_at_ms,
        )
        if decision.withheld is WithheldReason.COORDINATOR_VIEW_BEHIND:
            if rewound:
                decision = decision._replace(withheld=WithheldReason.COORDINATOR_LOG_REWOUND)
            elif undecodable:
                decision = decision._replace(withheld=WithheldReason.COORDINATOR_RECORD_UNDECODABLE)
        moment = decision.judged_as_of_ms or t.observed_at_ms
        if decision.kind is VerdictKind.HANGING and (
            self._appended_after_report(entry.moved_on_at, moment)
            if decision.reason is HangingReason.OWNER_MOVED_ON
            else self._appended_after_report((self._log_partition(transactional_id), kept[1]), moment)
            if kept is not None
            else self._record_after_report(key[0], transactional_id, moment)
        ):
            decision = Decision(
                VerdictKind.UNCONFIRMED, decision.reason, decision.role, WithheldReason.COLLECTOR_CLOCK_AHEAD
            )
        decided = (decision.kind.value, decision.reason.value if decision.reason else None)
        explanation = None
        events: list[Event] = []
        opens_candidate = decision.kind is VerdictKind.HANGING and entry.candidate_json is None
        # A candidate whose proof no longer holds is withdrawn, not left OPENED until the transaction ends: on-call
        # may act on an OPENED candidate (`withdraws_proof`).
        withdraws = entry.candidate_json is not None and withdraws_proof(decision, owned_by_coordinator(t, c))
        if decided != entry.decided and decision.kind is VerdictKind.OPEN and not withdraws:
            # Most transactions are short and plain OPEN: nobody reads their explanation, and building one
            # (the models, tens of microseconds) was the largest cost of a snapshot row.
            entry = entry._replace(decided=decided)
            self.opens[key] = entry
            self.opens_changed = True
        elif decided != entry.decided or opens_candidate or withdraws:
            # Explaining needs the models: only for news.
            snapshot = PartitionSnapshot.model_validate_json(entry.snapshot_json)
            view = self.views.get(key[0])
            record = (
                CoordinatorRecord.model_validate_json(kept[0])
                if kept is not None
                else CoordinatorRecord.model_validate_json(view.record_json)
                if c is not None and view is not None and view.record_json is not None
                else None
            )
            verdict = build_verdict(
                decision,
                snapshot.open_transactions[0],
                snapshot,
                record,
                now_ms=t.observed_at_ms,
                limits=self.config.limits,
                retired_at_ms=retired_at_ms,
                view_current_ms=view_current_ms,
                first_seen_ms=t.first_seen_ms,
                moved_on_ms=t.moved_on_ms,
            )
            explanation = verdict.explanation
            candidate_json = entry.candidate_json
            if opens_candidate:
                planned = plan_abort(
                    snapshot,
                    snapshot.open_transactions[0],
                    verdict,
                    bootstrap=self.config.bootstrap,
                    command_config=self.config.command_config,
                    first_detected_ms=now_ms,
                )
                candidate_json = planned.model_dump_json()
                events.append(self._candidate_event("OPENED", planned, entry.leader, now_ms))
            elif withdraws and candidate_json is not None:
                withdrawn = AbortCandidate.model_validate_json(candidate_json).withdrawn(
                    withdrawn_at_ms=now_ms, reason=explanation
                )
                events.append(self._candidate_event("WITHDRAWN", withdrawn, entry.leader, now_ms))
                candidate_json = None  # proven again later: OPENED again
            entry = entry._replace(decided=decided, candidate_json=candidate_json)
            self.opens[key] = entry
            self.opens_changed = True
        candidate_id = (
            AbortCandidate.model_validate_json(entry.candidate_json).candidate_id
            if entry.candidate_json is not None
            else None
        )
        withheld = decision.withheld.value if decision.withheld else None
        news = VerdictNews(
            decided[0],
            decided[1],
            withheld,
            candidate_id,
            two_phase_commit(t, c),
            transactional_id,
            entry.leader,
            entry.start_offset,
            entry.lso_lag,
            t.open_since_ms,
        )
        if news == entry.announced:
            return events  # the driver knows it already
        # Stored as a plain tuple, as the rest of the entry (`_save` in streaming/reconcile.py).
        self.opens[key] = entry._replace(announced=tuple(news))
        self.opens_changed = True
        events.append(
            (
                "VERDICT",
                key[0],
                key[1],
                key[2],
                news.leader,
                news.start_offset,
                news.kind,
                news.reason,
                age_ms(t.observed_at_ms, t.open_since_ms),
                news.lso_lag,
                explanation,
                news.candidate_id,
                None,
                now_ms,
                news.withheld,
                news.two_phase_commit,
                news.transactional_id,
            )
        )
        return events

    @staticmethod
    def _candidate_event(event: str, c: AbortCandidate, leader: int | None, now_ms: int) -> Event:
        return (
            event,
            c.spec.producer_id,
            c.topic,
            c.partition,
            leader,
            c.start_offset,
            VerdictKind.HANGING.value,
            c.reason.value,
            c.evidence.age_ms,
            None,
            c.withdrawn_reason if c.withdrawn_reason is not None else c.explanation,
            c.candidate_id,
            c.model_dump_json(),
            now_ms,
            None,
            c.two_phase_commit,
            c.evidence.coordinator.transactional_id if c.evidence.coordinator is not None else None,
        )

    # -- forgetting

    def _gone(self, key: OpenKey, entry: OpenEntry, now_ms: int) -> list[Event]:
        producer_id, topic, partition = key
        events: list[Event] = [
            ("GONE", producer_id, topic, partition, entry.leader, entry.start_offset)
            + (None,) * 7
            + (now_ms, None, None, None)
        ]
        if entry.candidate_json is not None:
            resolved = AbortCandidate.model_validate_json(entry.candidate_json).resolved(
                resolved_at_ms=now_ms
            )
            events.append(self._candidate_event("RESOLVED", resolved, entry.leader, now_ms))
        return events

    def _forget(self, key: OpenKey, entry: OpenEntry, now_ms: int) -> list[Event]:
        del self.opens[key]
        keys = self._keys_of.get(key[0])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._keys_of[key[0]]
        self.opens_changed = True
        return self._gone(key, entry, now_ms)

    def expire(self, now_ms: int) -> list[Event]:
        """The timer's work: forget the open transactions no snapshot confirmed for `expire_after_ms`. (Views
        are forgotten by the state store's TTL: `view_homes`.)"""
        return self.evaluate(set(), set(), now_ms)

    def view_homes(self) -> list[tuple[int, View, bool]]:
        """The views to write back: (producer id, view, kept past the TTL? `kept_past_ttl`) for every view this
        batch changed, and for every view whose producer id started or stopped having an open transaction tracked
        (it moves between the views kept and the ones that expire). A view that stops being kept expires
        `view_ttl_ms` after it moved, which is never sooner than the TTL after its last update."""
        in_use = {key[0] for key in self.opens}
        homes = []
        for pid in sorted(self.views.changed | (in_use ^ self._in_use_at_load)):
            view = self.views.get(pid)
            if view is not None:
                homes.append((pid, view, kept_past_ttl(view, pid in in_use)))
        return homes

    def next_deadline(self) -> int | None:
        """When the timer must fire next: the earliest expiry of an open transaction."""
        return min((e.confirmed_ms + self.config.expire_after_ms for e in self.opens.values()), default=None)


def reconcile_bucket(
    bucket: BucketState,
    columns: Sequence[list[Any]],
    now_ms: int,
    *,
    report_view: bool = False,
    announce: bool = False,
) -> list[Event]:
    """One batch of stage-2 input rows (STAGE2_INPUT_COLUMNS[1:] as column lists) applied to a bucket.

    Order: the view's progress and the collector's positions first (how current the view is), then the
    coordinator facts, then the open transactions are judged. `report_view` adds a VIEW event (one bucket does).
    `announce` emits a VERDICT for every open transaction tracked, changed or not (`BucketState.announce_again`).
    """
    (pid, fact, _tid, record_json, fact_time, log_offset, topic, partition, snapshot_json, observed, leader,
     offset, epoch, start_epoch, start_ts, last_ts, opened_after, seen_open, max_timeout,
     lso_lag, start_leader_epoch, leader_epoch) = columns  # fmt: skip
    events: list[Event] = []
    producer_ids: set[int] = bucket.announce_again() if announce else set()
    confirmed_now: set[OpenKey] = set()
    opens = [i for i, f in enumerate(fact) if f == "open"]
    # Coordinator facts in log order (progress and positions carry none; their order does not matter).
    facts = sorted((i for i, f in enumerate(fact) if f != "open"), key=lambda i: _position(log_offset[i]))
    for i in opens:
        key = (pid[i], topic[i], partition[i])
        row = OpenRow(
            pid[i], topic[i], partition[i], snapshot_json[i], observed[i], leader[i], offset[i],
            epoch[i], start_epoch[i], start_ts[i], last_ts[i], opened_after[i], seen_open[i], max_timeout[i],
            lso_lag[i], start_leader_epoch[i], leader_epoch[i],
        )  # fmt: skip
        events.extend(bucket.confirm_open(key, row, now_ms))
        confirmed_now.add(key)
        producer_ids.add(pid[i])
    # What the batch's reading skipped (compaction) or read again (a rewound log) first: it decides what the
    # positions covered by its "applied" facts may vouch for.
    reads = [(_tid[i], record_json[i], fact_time[i]) for i in facts if fact[i] == "read"]
    if reads:
        bucket.apply_reads(reads)
    for i in facts:
        kind = fact[i]
        if kind == "read":
            continue
        if kind == "applied":
            bucket.apply_progress(_tid[i], record_json[i])
        elif kind == "position":
            bucket.apply_position(record_json[i])
        elif kind == "undecodable":
            bucket.apply_undecodable(_tid[i], record_json[i])
        else:
            bucket.apply_fact(pid[i], kind, record_json[i], fact_time[i], _position(log_offset[i]), now_ms)
            producer_ids.add(pid[i])
    events.extend(bucket.evaluate(producer_ids, confirmed_now, now_ms))
    if report_view:
        events.append(bucket.view_event(now_ms))
    return events


def owned_by_coordinator(t: TxnFacts, c: CoordFacts | None) -> bool:
    """The coordinator's view says it may still close the transaction: the producer id's current record is
    Ongoing or Prepare* and lists the partition, or the producer id is the next one of a handover in progress."""
    if c is None or c.state is None:
        return False
    if c.next_producer_id == t.producer_id and c.producer_id != t.producer_id:
        return True
    return (
        c.producer_id == t.producer_id and c.state in OWNING_STATES and (t.topic, t.partition) in c.partitions
    )


def withdraws_proof(decision: Decision, owned: bool) -> bool:
    """Whether a new decision takes back an earlier HANGING proof of the same open transaction: when the coordinator's
    view now says it may still close it (`owned`), or the verdict is withheld for a reason that undermines the
    evidence (`_UNDERMINED`); never for a verdict that only waits, or every Kafka outage or owner restart would
    withdraw and re-open candidates (docs/detection.md, section 3, "Withdrawn candidates")."""
    if decision.kind is VerdictKind.HANGING:
        return False
    if owned:
        return True
    return decision.kind is VerdictKind.UNCONFIRMED and decision.withheld in _UNDERMINED


# Withheld reasons that say the evidence a proof rested on may have been wrong (not merely behind).
_UNDERMINED = frozenset(
    {
        WithheldReason.COORDINATOR_RECORD_UNDECODABLE,
        WithheldReason.COORDINATOR_LOG_REWOUND,
        WithheldReason.COORDINATOR_VIEW_INCONSISTENT,
        WithheldReason.COMMIT_OR_LATE_WRITE,
        WithheldReason.COLLECTOR_CLOCK_AHEAD,
    }
)


def _position(log_offset: int | None) -> int:
    return -1 if log_offset is None else log_offset
