"""The metric contract as the docs state it (docs/streaming.md and docs/collector.md tables, ARCHITECTURE.md's
list when shared/ is beside the clone), and checks of a real /metrics body against it. Shared by tests/ops and
tests/e2e/test_alerts_live.py (loaded by path there)."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT.parent / "shared" / "ARCHITECTURE.md"


@dataclass(frozen=True)
class Documented:
    name: str  # the family name as Prometheus stores it (counters with `_total`)
    labels: frozenset[str]
    type: str  # gauge | counter | histogram
    where: str


def _row_cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def documented() -> dict[str, Documented]:
    """Every metric the docs' tables name, with its labels and type."""
    out: dict[str, Documented] = {}
    for line in (ROOT / "docs" / "streaming.md").read_text().splitlines():
        m = re.match(r"\| `(txnwatch_\w+)` \|", line)
        if not m:
            continue
        name = m.group(1)
        cells = _row_cells(line)
        labels = frozenset(x.strip() for x in cells[1].split(",") if x.strip())
        kind = "histogram" if "histogram" in cells[2] else "counter" if name.endswith("_total") else "gauge"
        out[name] = Documented(name, labels, kind, "docs/streaming.md")
    for line in (ROOT / "docs" / "collector.md").read_text().splitlines():
        if not re.match(r"\| `\w+", line):
            continue
        cells = _row_cells(line)
        if len(cells) < 3 or cells[1] not in ("gauge", "counter", "histogram"):
            continue
        for item in re.findall(r"`(\w+)(?:\{([^}]*)\})?`", cells[0]):
            name = f"txnwatch_collector_{item[0]}"
            labels = frozenset(x.strip() for x in item[1].split(",") if x.strip())
            out[name] = Documented(name, labels, cells[1], "docs/collector.md")
    return out


def architecture() -> dict[str, frozenset[str]]:
    """`name{labels}` pairs ARCHITECTURE.md's Prometheus contract states ({} when shared/ is not beside the
    clone)."""
    if not ARCHITECTURE.exists():
        return {}
    return {
        m.group(1): frozenset(x.strip() for x in m.group(2).split(","))
        for m in re.finditer(r"`(txnwatch_\w+)\{([^}]*)\}`", ARCHITECTURE.read_text())
    }


def families(body: str) -> dict[str, tuple[str, frozenset[str], int]]:
    """A /metrics body: family name -> (type, label names of its samples, number of samples).

    Counters are keyed with `_total` (the parser strips it from the family name)."""
    out: dict[str, tuple[str, frozenset[str], int]] = {}
    for fam in text_string_to_metric_families(body):
        name = f"{fam.name}_total" if fam.type == "counter" else fam.name
        labels: set[str] = set()
        for s in fam.samples:
            labels |= set(s.labels) - {"le", "quantile"}
        out[name] = (fam.type, frozenset(labels), len(fam.samples))
    return out


def contract_violations(body: str, prefix: str, *, but: str | None = None) -> list[str]:
    """What a real /metrics body gets wrong against the docs: undocumented txnwatch metrics, wrong types, other
    labels. The documented metrics named `prefix`* (but not `but`*) must all be exposed, even without samples."""
    docs = documented()
    seen = families(body)
    problems: list[str] = []
    for name, (kind, labels, n) in seen.items():
        if not name.startswith("txnwatch_"):
            continue
        d = docs.get(name)
        if d is None:
            problems.append(f"{name} is not in the docs' metric tables")
            continue
        if kind != d.type:
            problems.append(f"{name}: type {kind}, {d.where} says {d.type}")
        if n and labels != d.labels:
            problems.append(f"{name}: labels {sorted(labels)}, {d.where} says {sorted(d.labels)}")
    for name, d in docs.items():
        if name.startswith(prefix) and not (but and name.startswith(but)) and name not in seen:
            problems.append(f"{name} ({d.where}) is not exposed")
    return problems


def promtool_check_metrics(promtool: Path, body: str) -> str:
    """`promtool check metrics` on a body; returns its complaints ('' when clean)."""
    done = subprocess.run(
        [str(promtool), "check", "metrics"], input=body, capture_output=True, text=True, timeout=60
    )
    return "" if done.returncode == 0 and not done.stdout.strip() else (done.stdout + done.stderr).strip()
