"""The sizing and latency figures the docs quote are the ones in `benchmarks/results/`.

README.md and docs/*.md quote figures from the last `make bench` run (latency, throughput, catch-up, the
collector's sweep). Each quoted figure is named below with the results file and key its value lives in; the test
renders the sentence the doc must contain from the results as they are now, so a new `make bench` run that moves a
figure fails here until the text is updated (the failure prints the expected wording). "At the default settings"
may only be said of a latency measured at the defaults (`common/settings.py`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from common.settings import CollectorSettings, StreamSettings

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DEFAULTS_PHRASE = "at the default settings"


@dataclass(frozen=True)
class Quoted:
    name: str  # what the figure is
    doc: str  # where it is quoted, relative to the repository
    text: str  # the words the doc must contain, rendered from the results
    source: str  # where its value lives


@cache
def result(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((RESULTS / f"{name}.json").read_text())["result"]
    return loaded


def reconcile(name: str, phase: str) -> dict[str, Any]:
    """The job's own query (not the plain read or parse run beside it) on one input."""
    (found,) = [
        p
        for p in result(name)["phases"]
        if p["phase"] == phase and p.get("stage", "reconcile") == "reconcile"
    ]
    return found


def thousands(rate: float) -> str:
    return f"{round(rate / 1000)}k"


def trigger_s(trigger: str) -> int:
    seconds, unit = trigger.split()
    assert unit == "seconds", trigger
    return int(seconds)


def default_interval_s() -> float:
    return float(CollectorSettings.model_fields["interval_s"].default)


def default_probe_ms() -> int:
    return int(CollectorSettings.model_fields["probe_interval_ms"].default)


def latency_at_defaults(r: dict[str, Any]) -> bool:
    default_trigger = StreamSettings.model_fields["trigger"].default
    # A run from before the probe existed has no probe setting: it swept only, which is not today's default.
    return bool(
        r["settings"]["interval_s"] == default_interval_s()
        and r["settings"]["trigger"] == default_trigger
        and r["settings"].get("probe_interval_ms") == default_probe_ms()
    )


def latency_settings(r: dict[str, Any]) -> str:
    """How the README names the settings the latency was measured at: the defaults only when they were."""
    interval = r["settings"]["interval_s"]
    trigger = trigger_s(r["settings"]["trigger"])
    if latency_at_defaults(r):
        probe_s = r["settings"]["probe_interval_ms"] / 1000
        return (
            f"Measured {DEFAULTS_PHRASE} (a {interval:g} s sweep with a probe every {probe_s:g} s between sweeps, "
            f"the job's {trigger} s trigger)"
        )
    return (
        f"Measured at a {interval:g} s collector sweep (`--interval-ms {interval * 1000:.0f}`; the default is "
        f"{default_interval_s():g} s) and the job's {trigger} s trigger"
    )


def latency_method(r: dict[str, Any]) -> str:
    """BENCHMARKS.md's account of the settings the latency was measured at."""
    interval = r["settings"]["interval_s"]
    if latency_at_defaults(r):
        return (
            f"{DEFAULTS_PHRASE}: a {interval:g} s sweep and a probe every {r['settings']['probe_interval_ms']} ms "
            "(`txnwatch collect` without `--interval-ms` or `--probe-interval-ms`)"
        )
    return (
        f"at a {interval:g} s sweep (`txnwatch collect --interval-ms {interval * 1000:.0f}`; the collector's default "
        f"is {default_interval_s():g} s) and otherwise the defaults"
    )


def latency_target(r: dict[str, Any]) -> str:
    """BENCHMARKS.md's verdict on the latency target, at the settings it was measured at."""
    where = DEFAULTS_PHRASE if latency_at_defaults(r) else f"at a {r['settings']['interval_s']:g} s sweep"
    return f"**Target p95 ≤ 10 s {where}: {'met' if r['all']['p95'] <= 10 else 'missed'}.**"


def owners_sentence(r: dict[str, Any]) -> str:
    """How the docs compare orphans whose owner lives on with those whose owner restarts."""
    busy, restart = r["per_owner"]["busy"], r["per_owner"]["restart"]
    return (
        f"all {busy['found_while_busy']} of {busy['orphans']} found while it still committed, p95 {busy['p95']} s "
        f"against {restart['p95']} s for owners that restart at once"
    )


def sweep_rows() -> str:
    # Not measured: the arithmetic of the default interval (one snapshot row per partition with open transactions).
    interval = default_interval_s()
    return f"1,000 such partitions swept every {interval:g} s, the default, are {1000 / interval:.0f} rows/s"


def idle_sentence() -> str:
    """What the job and the collector cost at their defaults, quiet and busy (the shipped variant)."""
    idle = result("idle")
    (shipped,) = [v for v in idle["variants"] if v["variant"] == "shipped"]
    return (
        f"together use {shipped['quiet']['together_cpu_s_per_s']:.2f} of a core on a quiet cluster and "
        f"{shipped['busy']['together_cpu_s_per_s']:.2f} on one committing {idle['settings']['busy_rate']:g} "
        "transactions a second"
    )


def quoted() -> list[Quoted]:
    lat = result("latency")
    cpus = lat["machine"]["cpus"]
    c5, s5 = reconcile("stream", "coordinator"), reconcile("stream", "snapshot")
    c10, s10 = reconcile("stream_10s", "coordinator"), reconcile("stream_10s", "snapshot")
    t5, t10 = trigger_s(c5["trigger"]), trigger_s(c10["trigger"])
    s5_fits = "within" if s5["batch_s_p99"] <= t5 else "longer than"
    col = result("collector")
    catchup = sorted(result(n)["current_after_s"] for n in ("catchup", "state1m"))
    fp = lat["false_positives"]
    return [
        Quoted(
            "detection latency, its settings and sample",
            "README.md",
            f"{latency_settings(lat)}, a new orphan becomes an abort candidate about {lat['all']['p50']:.0f} s after "
            f"its first write (p95 {lat['all']['p95']} s over {lat['orphans']} real orphans on {cpus} cores), with "
            f"{'no false candidate' if fp == 0 else f'{fp} false candidates'} among the "
            f"{lat['steady_transactions']:,} healthy transactions around it",
            "latency.json: settings, all.p50, all.p95, orphans, false_positives, steady_transactions",
        ),
        Quoted(
            "detection latency by how the orphan's owner ends",
            "README.md",
            owners_sentence(lat),
            "latency.json: per_owner",
        ),
        Quoted(
            "detection latency by how the orphan's owner ends, in the benchmark's prose",
            "docs/BENCHMARKS.md",
            owners_sentence(lat),
            "latency.json: per_owner",
        ),
        Quoted(
            "detection latency in the benchmark's prose",
            "docs/BENCHMARKS.md",
            f"none of the {lat['steady_transactions']:,} steady transactions proposed: p50 {lat['all']['p50']} s, "
            f"p95 {lat['all']['p95']} s, max {lat['all']['max']} s",
            "latency.json: steady_transactions, all.p50, all.p95, all.max",
        ),
        Quoted(
            "the settings the latency was measured at",
            "docs/BENCHMARKS.md",
            latency_method(lat),
            "latency.json: settings.interval_s",
        ),
        Quoted(
            "the latency target, at the settings measured",
            "docs/BENCHMARKS.md",
            latency_target(lat),
            "latency.json: settings.interval_s, settings.trigger, all.p95",
        ),
        Quoted(
            "coordinator throughput at the default trigger",
            "README.md",
            f"On {cpus} cores (`{result('stream')['master']}`), at its {t5} s trigger, the job keeps up with about "
            f"{thousands(c5['sustained_rows_per_s'])} coordinator records/s (batch p99 {c5['batch_s_p99']:.1f} s)",
            "stream.json: phases[coordinator, reconcile].sustained_rows_per_s, batch_s_p99",
        ),
        Quoted(
            "snapshot throughput at the default trigger",
            "README.md",
            f"or about {thousands(s5['sustained_rows_per_s'])} snapshot rows/s (batch p99 "
            f"{s5['batch_s_p99']:.1f} s, {s5_fits} the trigger)",
            "stream.json: phases[snapshot, reconcile].sustained_rows_per_s, batch_s_p99",
        ),
        Quoted(
            "throughput at a 10 s trigger",
            "README.md",
            f"a {t10} s trigger gives about {thousands(c10['sustained_rows_per_s'])} and "
            f"{thousands(s10['sustained_rows_per_s'])}",
            "stream_10s.json: phases[coordinator|snapshot].sustained_rows_per_s",
        ),
        Quoted(
            "the job's and the collector's CPU when nothing happens",
            "README.md",
            idle_sentence(),
            "idle.json: variants[shipped].quiet|busy.together_cpu_s_per_s, settings.busy_rate",
        ),
        Quoted(
            "snapshot rows of a sweep",
            "README.md",
            sweep_rows(),
            "common/settings.py: CollectorSettings.interval_s",
        ),
        Quoted(
            "the job's rates for sizing",
            "docs/deploy.md",
            f"{c5['sustained_rows_per_s']:,} coordinator records/s and {s5['sustained_rows_per_s']:,} snapshot "
            f"rows/s at the {t5} s trigger ({c10['sustained_rows_per_s']:,} and {s10['sustained_rows_per_s']:,} at "
            f"{t10} s), that is **about {thousands(c5['sustained_rows_per_s'] / cpus)} coordinator records/s and "
            f"{thousands(s5['sustained_rows_per_s'] / cpus)} snapshot rows/s per core**",
            "stream.json, stream_10s.json: sustained_rows_per_s; latency.json: machine.cpus",
        ),
        Quoted(
            "snapshot rows of a sweep",
            "docs/deploy.md",
            sweep_rows().replace("swept every", "every"),
            "common/settings.py: CollectorSettings.interval_s",
        ),
        Quoted(
            "the collector's steady sweep",
            "docs/deploy.md",
            f"a steady sweep of {col['user_partitions']:,} partitions took {col['steady_sweep_s_min']:.2f}–"
            f"{col['steady_sweep_s_max']:.2f} s (median {col['steady_sweep_s_median']:.2f} s)",
            "collector.json: user_partitions, steady_sweep_s_min, steady_sweep_s_max, steady_sweep_s_median",
        ),
        Quoted(
            "catch-up of a new checkpoint",
            "docs/deploy.md",
            f"about {catchup[0]:.0f}–{catchup[1]:.0f} s per million retained coordinator records on {cpus} cores",
            "catchup.json, state1m.json: current_after_s (1,000,000 records each)",
        ),
        Quoted(
            "a healthy job's rates behind the falling-behind alert",
            "docs/alerting.md",
            f"at the measured ~{thousands(c5['sustained_rows_per_s'])} coordinator records/s and "
            f"~{thousands(s5['sustained_rows_per_s'])} snapshot rows/s on {cpus} cores",
            "stream.json: phases[coordinator|snapshot, reconcile].sustained_rows_per_s",
        ),
    ]


def words(text: str) -> str:
    """The doc's text with line breaks and runs of spaces as one space: wrapping does not change a figure."""
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("q", quoted(), ids=lambda q: f"{q.doc}: {q.name}")
def test_the_doc_quotes_the_figure_the_results_hold(q: Quoted) -> None:
    text = words((ROOT / q.doc).read_text(encoding="utf-8"))
    assert words(q.text) in text, f"{q.doc} should say, from {q.source}:\n  {q.text}"


@pytest.mark.parametrize("doc", ["README.md", "docs/BENCHMARKS.md"])
def test_default_settings_are_claimed_only_for_a_latency_measured_at_them(doc: str) -> None:
    lat = result("latency")
    if latency_at_defaults(lat):
        return  # measured at the defaults: the docs may say so
    text = words((ROOT / doc).read_text(encoding="utf-8")).lower()
    assert DEFAULTS_PHRASE not in text, (
        f"{doc} says '{DEFAULTS_PHRASE}', but latency.json was measured at a {lat['settings']['interval_s']:g} s "
        f"sweep and a {lat['settings']['trigger']} trigger (defaults: {default_interval_s():g} s, "
        f"{StreamSettings.model_fields['trigger'].default})"
    )


def test_a_moved_figure_changes_the_expected_text() -> None:
    # The check must see a new result: the same sentence rendered from a re-measured p95 no longer matches.
    lat = result("latency")
    (readme,) = [q for q in quoted() if q.name == "detection latency, its settings and sample"]
    moved = readme.text.replace(f"p95 {lat['all']['p95']} s", f"p95 {lat['all']['p95'] + 1} s")
    assert moved != readme.text and words(moved) not in words(
        (ROOT / "README.md").read_text(encoding="utf-8")
    )
