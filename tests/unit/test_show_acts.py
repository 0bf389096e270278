"""`proposals show` offers Kafka's `kafka-transactions.sh abort` line only while verification says SAFE.

Kafka's tool re-checks nothing: printed beside a refusal (the coordinator owns the transaction again, the owner is
live at the orphan's epoch, the epoch moved) it hands on-call the very marker txnwatch refused to write. The
runbook allows that line only right after `show` said SAFE; these tests hold `show` to the same condition, in its
text and in its JSON.
"""

from __future__ import annotations

import pytest
from builders import T0
from test_verified_abort import judged, leader, live, owner

from admin.proposals.verified_marker import ActWith, Surroundings, render_show, show_json
from admin.wire.types import GroupOffsets
from detectors.abort import verify_abort
from detectors.models import LiveEvidence, VerifyOutcome

pytestmark = pytest.mark.unit

ACT = ActWith("b:9092", "prod", "txnwatch")
AROUND = Surroundings(GroupOffsets({}))

REFUSALS = {
    "coordinator-owns-it": live(coordinator=owner(state="Ongoing", producer_epoch=5, partition_listed=True)),
    "prepare-commit": live(coordinator=owner(state="PrepareCommit", producer_epoch=5, partition_listed=True)),
    "live-owner-same-epoch": live(coordinator=owner(state="CompleteCommit", producer_epoch=5)),
    "epoch-moved": live(producer=leader(producer_epoch=6)),
}


def _act_lines(shown: str) -> list[str]:
    return [line for line in shown.splitlines() if line.lstrip().startswith("act")]


@pytest.mark.parametrize("evidence", REFUSALS.values(), ids=REFUSALS.keys())
def test_a_refused_abort_is_never_offered_through_kafkas_tool(evidence: LiveEvidence) -> None:
    c = judged(0)
    verify = verify_abort(c, evidence)
    assert verify.outcome is VerifyOutcome.REFUSED, verify
    shown = render_show(c, evidence, verify, ACT, T0, AROUND)
    assert not [line for line in _act_lines(shown) if "kafka-transactions.sh" in line], shown
    assert show_json(c, evidence, verify, ACT, T0, AROUND)["act"]["kafka_cli"] is None


def test_a_safe_abort_shows_kafkas_line_beside_the_verified_one() -> None:
    c = judged(0)
    evidence = live()  # the owner restarted (epoch 6): nothing can join the orphan's transaction
    verify = verify_abort(c, evidence)
    assert verify.outcome is VerifyOutcome.SAFE, verify
    shown = render_show(c, evidence, verify, ACT, T0, AROUND)
    kafka_line = ACT.kafka_cli(c)
    assert kafka_line.startswith("kafka-transactions.sh --bootstrap-server b:9092 abort --topic orders")
    assert any(line.endswith(kafka_line) for line in _act_lines(shown)), shown
    assert any(line.endswith(ACT.txnwatch(c)) for line in _act_lines(shown)), shown
    assert show_json(c, evidence, verify, ACT, T0, AROUND)["act"]["kafka_cli"] == kafka_line
