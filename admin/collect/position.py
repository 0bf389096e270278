"""How far a coordinator topic has reached: the `CoordinatorLogPosition` that tells the streaming job when its
coordinator view is current (docs/detection.md, section 4).

The sweep measures `__transaction_state` right after its DescribeProducers answers; the describe fallback
measures `<prefix>.coordinator-state` once a poll's records are acknowledged. Both use `measure_log_position`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from admin.wire.errors import explain, is_authorization_error
from admin.wire.types import TP, ClusterView, ClusterWire, EndOffset
from detectors.models import CoordinatorLogPosition


def measure_log_position(
    wire: ClusterWire,
    view: ClusterView,
    topic: str,
    *,
    cluster: str,
    sweep_id: str,
    as_of_ms: int,
    skip_brokers: Collection[int] = frozenset(),
    log_end_offsets: bool = False,
) -> tuple[CoordinatorLogPosition | None, list[str]]:
    """How far `topic` has reached: the high watermark of each of its partitions in `view`, asked of its leader
    now, as a position as of `as_of_ms`.

    The caller reads `as_of_ms` *before* calling: the offsets asked for now are at least what they were then,
    so every record written by that moment lies below them. Each leader is asked at its leader epoch in `view`,
    so a broker that is no longer the leader at that epoch answers an error, not its stale high watermark
    (`Partition.localLogWithEpochOrThrow`). Partitions without a leader, led by a broker in
    `skip_brokers` (it failed this sweep; asking again would only wait for its timeout), or answering with an
    error are left out: the job keeps them as current as an earlier position made them.

    With `log_end_offsets`, the same leaders are then asked for their log end offsets (after the high watermarks,
    so both after `as_of_ms`): a record at or above one was appended after `as_of_ms`, which is what shows the
    job a collector clock running ahead of the coordinators' (`__transaction_state` only; a partition whose
    leader fails this second question just goes without).

    Returns:
        The position (None if `topic` is not in `view`, e.g. no transaction ever ran, or no partition
        answered) and one problem message per kind of failure.
    """
    partitions = sorted(p for t, p in view.leaders if t == topic)
    if not partitions:
        return None, []
    wanted: dict[int, list[TP]] = {}
    failed: dict[str, list[int]] = {}
    for p in partitions:
        leader = view.leaders[(topic, p)]
        if leader < 0:
            failed.setdefault("LEADER_NOT_AVAILABLE", []).append(p)
        elif leader in skip_brokers:
            failed.setdefault("BROKER_BACKOFF", []).append(p)
        else:
            wanted.setdefault(leader, []).append((topic, p))
    # Fenced at the leader epoch of record: a deposed leader (still serving, reached through stale metadata)
    # would answer its own high watermark, below records the new leader has committed since; it refuses instead.
    epochs = {tp: view.leader_epochs[tp] for tps in wanted.values() for tp in tps if tp in view.leader_epochs}
    if not wanted:
        answers: dict[TP, EndOffset] = {}
    elif epochs:
        answers = wire.end_offsets(wanted, epochs)
    else:  # metadata without epochs (before v7): nothing to fence with
        answers = wire.end_offsets(wanted)
    end_offsets: dict[int, int] = {}
    for tps in wanted.values():
        for tp in tps:
            answer = answers.get(tp, EndOffset(None, "MISSING_FROM_RESPONSE"))
            if answer.error is None and answer.offset is not None and answer.offset >= 0:
                end_offsets[tp[1]] = answer.offset
            else:
                failed.setdefault(answer.error or "NO_OFFSET", []).append(tp[1])
    problems = [_position_problem(topic, error, ps) for error, ps in sorted(failed.items())]
    if not end_offsets:
        # An empty position would vouch for nothing, yet tell the job its view is measured.
        return None, problems
    log_ends: dict[int, int] = {}
    if log_end_offsets:
        measured = {b: [tp for tp in tps if tp[1] in end_offsets] for b, tps in wanted.items()}
        log_ends = _log_end_offsets(wire, {b: tps for b, tps in measured.items() if tps}, epochs)
    position = CoordinatorLogPosition(
        cluster=cluster,
        sweep_id=sweep_id,
        topic=topic,
        partitions=partitions[-1] + 1,
        as_of_ms=as_of_ms,
        end_offsets=end_offsets,
        log_end_offsets=log_ends,
    )
    return position, problems


def _log_end_offsets(wire: ClusterWire, wanted: dict[int, list[TP]], epochs: dict[TP, int]) -> dict[int, int]:
    """Each partition's log end offset, from the leader asked for its high watermark; failures are left out (the
    job then cannot check the clocks against that partition this sweep, nothing more)."""
    answers = wire.end_offsets(wanted, epochs or None, log_end=True)
    return {
        tp[1]: answer.offset
        for tp, answer in answers.items()
        if answer.error is None and answer.offset is not None and answer.offset >= 0
    }


def _position_problem(topic: str, error: str, partitions: Sequence[int]) -> str:
    if is_authorization_error(error):
        # The same every sweep, so it is logged once: names the ACL (Describe on the topic).
        return explain("ListOffsets", error, topic)
    listed = ", ".join(str(p) for p in sorted(partitions))
    return (
        f"{explain('ListOffsets', error, topic)}: partitions {listed} left out of its coordinator log "
        "position this sweep"
    )
