"""Draws a Grafana dashboard JSON (deploy/grafana/txnwatch.json) from a real Prometheus: the JSON itself, not a
redraw of what the generator meant.

    python deploy/grafana/render.py --prometheus http://127.0.0.1:9090 --out x.png [--json FILE] [--minutes 10]

No Grafana can run here, so this is the project's own renderer of Grafana's JSON model. It reads the file, checks
it against Grafana's dashboard model (grafana-foundation-sdk decodes it, panel options by panel type, and encodes
it back: a key the model does not know is dropped and reported), then draws every panel at its gridPos on
Grafana's grid (24 columns, 30 px rows, 8 px gaps) with its title, its links' icon and its targets' answers from
Prometheus, as Grafana's panel types do: a stat reduces its range query by its calcs, colours its background by
thresholds or value mappings and draws its sparkline; a table runs its instant queries, merges them on their
labels and organizes the columns as its transformations say, units per column, sorted as saved; a time series
draws its range queries (stacked or not) with the legend table and its calcs.

Whatever it cannot draw as Grafana would (a panel type, transformation, unit, mapping, override, reducer, or a
merge of frames with different labels) raises Unsupported before anything is queried: a panel is never left out
of the picture or drawn as something else.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

HERE = Path(__file__).resolve().parent
JSON_PATH = HERE / "txnwatch.json"

# Grafana's grid: 24 columns, rows of 30 px with 8 px between panels (GRID_CELL_HEIGHT, GRID_CELL_VMARGIN).
COLUMNS = 24
ROW_PX = 30
GAP_PX = 8
WIDTH_PX = 1800
HEADER_PX = 44  # the dashboard's title line above the grid
TITLE_PX = 30  # a panel's header
TITLE_CHAR_PX = 8.8  # a character of the header's bold 10 pt DejaVu Sans at 100 dpi, wide enough for capitals
DPI = 100
# Grafana's dark theme: the named colours the dashboard uses, the canvas, a panel, its border and text.
COLORS = {"green": "#73BF69", "orange": "#FF9830", "red": "#F2495C", "yellow": "#FADE2A", "blue": "#5794F2"}
CANVAS, PANEL, BORDER, TEXT, WEAK = "#111217", "#181b1f", "#2c3235", "#ccccdc", "#8e8e9e"
# Grafana's classic palette, in order, for series without a fixed colour.
PALETTE = ("#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A9", "#705DA0", "#508642")

PANEL_TYPES = ("stat", "table", "timeseries")
UNITS = ("s", "none", "short", "cps", "reqps", "dateTimeAsIso")
REDUCERS = ("lastNotNull", "last", "max")
TRANSFORMATIONS = ("merge", "organize")
TICK_S = (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
NICE_S = (60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400)
CALC_NAMES = {"lastNotNull": "Last *", "last": "Last", "max": "Max"}


class Unsupported(Exception):
    """The JSON asks for something this renderer cannot draw as Grafana would."""


Result = list[dict[str, Any]]  # Prometheus's data.result: [{"metric": {...}, "value" | "values": ...}]


class Source(Protocol):
    """Answers a panel's PromQL as Prometheus's HTTP API does (data.result); range answers on `step` seconds."""

    step: float

    def instant(self, expr: str) -> Result: ...

    def ranged(self, expr: str) -> Result: ...


# ------------------------------------------------------------------------------------------------- the JSON model


def schema_problems(board: dict[str, Any]) -> list[str]:
    """Where the JSON leaves Grafana's dashboard model: keys that grafana-foundation-sdk's Dashboard (panels
    decoded by their type's options and field config, targets as Prometheus queries) does not know. Empty when
    the decoded-and-encoded dashboard holds everything the file holds."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    again = json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder))
    return list(_dropped(board, again, ""))


def _dropped(mine: Any, model: Any, where: str) -> Any:
    if isinstance(mine, dict) and isinstance(model, dict):
        for key, value in mine.items():
            if key not in model:
                yield f"{where}/{key}"
            else:
                yield from _dropped(value, model[key], f"{where}/{key}")
    elif isinstance(mine, list) and isinstance(model, list):
        if len(mine) != len(model):
            yield f"{where}: {len(mine)} items, the model keeps {len(model)}"
        for i, (a, b) in enumerate(zip(mine, model, strict=False)):
            yield from _dropped(a, b, f"{where}[{i}]")
    elif mine != model:
        yield f"{where}: {mine!r} read back as {model!r}"


def undrawable(panel: dict[str, Any]) -> list[str]:
    """Why this panel cannot be drawn as Grafana draws it (empty: it can)."""
    title = panel.get("title", "?")
    kind = panel.get("type")
    if kind not in PANEL_TYPES:
        return [f"{title}: panel type {kind!r} (drawn: {', '.join(PANEL_TYPES)})"]
    out: list[str] = []
    targets = panel.get("targets") or []
    if not targets:
        out.append(f"{title}: no target")
    for t in targets:
        if not t.get("expr"):
            out.append(f"{title}: target {t.get('refId')} has no PromQL")
        if kind == "table" and not (t.get("instant") and t.get("format") == "table"):
            out.append(f"{title}: table target {t.get('refId')} is not an instant query in table format")
        if kind != "table" and t.get("instant"):
            out.append(f"{title}: {kind} target {t.get('refId')} is instant")
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    units = [defaults.get("unit", "none")]
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        if override["matcher"]["id"] != "byName":
            out.append(f"{title}: override matcher {override['matcher']['id']}")
        for prop in override["properties"]:
            if prop["id"] != "unit":
                out.append(f"{title}: override property {prop['id']}")
            units.append(prop["value"])
    out += [f"{title}: unit {u!r}" for u in units if u not in UNITS]
    for m in defaults.get("mappings", []):
        if (m["type"] == "special" and m["options"]["match"] != "null") or m["type"] not in (
            "special",
            "value",
        ):
            out.append(f"{title}: value mapping {m['type']} {m['options'].get('match', '')}")
    if defaults.get("thresholds", {}).get("mode", "absolute") != "absolute":
        out.append(f"{title}: thresholds mode {defaults['thresholds']['mode']}")
    ids = [x["id"] for x in panel.get("transformations", [])]
    out += [f"{title}: transformation {i}" for i in ids if i not in TRANSFORMATIONS]
    if kind == "table" and len(targets) > 1 and "merge" not in ids:
        out.append(f"{title}: several table targets without merge (Grafana shows one frame at a time)")
    calcs = panel.get("options", {}).get("reduceOptions", {}).get("calcs", []) if kind == "stat" else []
    calcs += panel.get("options", {}).get("legend", {}).get("calcs", []) if kind == "timeseries" else []
    out += [f"{title}: reducer {c}" for c in calcs if c not in REDUCERS]
    stacking = defaults.get("custom", {}).get("stacking", {}).get("mode", "none")
    if stacking not in ("none", "normal"):
        out.append(f"{title}: stacking {stacking}")
    for link in [*panel.get("links", []), *defaults.get("links", [])]:
        if not link.get("url"):
            out.append(f"{title}: link {link.get('title')!r} without a url")
    return out


# ---------------------------------------------------------------------------------------------------- the values


def substitute(expr: str, *, rate_interval: str, interval: str = "15s", range_: str = "1h") -> str:
    """A panel expression with Grafana's variables replaced, as Prometheus receives it (cluster = All = .*)."""
    out = expr.replace("$__rate_interval", rate_interval).replace("$__interval", interval)
    out = out.replace("$__range", range_)
    return re.sub(r"\$\{?cluster\}?", ".*", out)


def formatted(value: float, unit: str) -> str:
    """A value as Grafana's value formats write it, for the units the dashboard uses."""
    if unit == "s":
        return _seconds(value)
    if unit == "dateTimeAsIso":
        return datetime.fromtimestamp(value / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
    if unit in ("cps", "reqps"):
        return f"{_number(value)} {'c/s' if unit == 'cps' else 'req/s'}"
    if unit == "short" and abs(value) >= 1000:
        for scale, suffix in ((1e9, " Bil"), (1e6, " Mil"), (1e3, " K")):
            if abs(value) >= scale:
                return f"{_number(value / scale)}{suffix}"
    return _number(value)


def _number(value: float) -> str:
    if float(value).is_integer():
        return f"{value:.0f}"
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}" if abs(value) < 100 else f"{value:.0f}"


def _seconds(value: float) -> str:
    # Grafana's toSeconds: ms below a second, then s, min, hour, day
    if value == 0:
        return "0 s"
    if abs(value) < 1:
        return f"{_number(value * 1000)} ms"
    for scale, name in ((86400, "day"), (3600, "hour"), (60, "min")):
        if abs(value) >= scale:
            return f"{_number(value / scale)} {name}"
    return f"{_number(value)} s"


def sample(text: str) -> float | None:
    """A sample value of Prometheus's answer; None for NaN (histogram_quantile of no rate), which Grafana's
    reducers skip like a null and its graphs leave as a gap."""
    value = float(text)
    return None if math.isnan(value) else value


def reduced(values: Sequence[float | None], calc: str) -> float | None:
    """One of Grafana's reducers over a series' values (None: no value)."""
    present = [v for v in values if v is not None]
    if calc == "last":
        return values[-1] if values else None
    if calc == "lastNotNull":
        return present[-1] if present else None
    if calc == "max":
        return max(present) if present else None
    raise Unsupported(f"reducer {calc}")


def mapped(mappings: Sequence[dict[str, Any]], value: float | None) -> dict[str, Any] | None:
    """The value mapping Grafana applies to `value` (None: no series): a special `null` match or an exact value
    (matched on the value's text, as Grafana does); None when none applies."""
    for m in mappings:
        if m["type"] == "special" and value is None and m["options"]["match"] == "null":
            return m["options"]["result"]  # type: ignore[no-any-return]
        if m["type"] == "value" and value is not None:
            hit = m["options"].get(format(value, "g"))
            if hit is not None:
                return hit  # type: ignore[no-any-return]
    return None


def threshold_color(steps: Sequence[dict[str, Any]], value: float | None) -> str:
    """The colour of the highest threshold step at or below `value` (the base step's for no value)."""
    color = str(steps[0]["color"])
    for step in steps[1:]:
        if value is not None and value >= step["value"]:
            color = str(step["color"])
    return color


def legend(fmt: str, labels: dict[str, str]) -> str:
    """A series' name as Grafana writes it: the legend format's {{label}}s, or the metric and labels."""
    if fmt:
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)
    name = labels.get("__name__", "")
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{rest}}}" if rest else name or "Value"


# ------------------------------------------------------------------------------------------------------- tables


@dataclass
class Table:
    columns: list[str]  # display names, in order
    rows: list[list[str]]  # formatted cells


def table(panel: dict[str, Any], source: Source, at_ms: float) -> Table:
    """The panel's instant queries as Grafana's table shows them: one frame per target (Time, the labels, then
    `Value`, or `Value #<refId>` when the panel has several targets, as Grafana's Prometheus data source names
    them), merged on equal labels, then organized (excluded, ordered, renamed), formatted by unit, sorted."""
    targets = panel["targets"]

    def value_name(ref: str) -> str:
        return f"Value #{ref}" if len(targets) > 1 else "Value"

    # a target's frame: the union of its series' labels (Grafana's table format leaves a missing label empty)
    frames = {
        t["refId"]: [(_labels(s), float(s["value"][1])) for s in source.instant(t["expr"])] for t in targets
    }
    label_sets = {frozenset(k for labels, _ in rows for k in labels) for rows in frames.values() if rows}
    if len(label_sets) > 1:
        # Grafana's merge joins frames on the fields they share; frames with different labels are not drawn here
        raise Unsupported(
            f"{panel['title']}: merge of frames with different labels {sorted(map(sorted, label_sets))}"
        )
    labels = sorted(label_sets.pop()) if label_sets else []
    merged: dict[tuple[str, ...], dict[str, Any]] = {}
    for ref, rows in frames.items():
        for row_labels, value in rows:
            key = tuple(row_labels.get(k, "") for k in labels)
            merged.setdefault(key, {"Time": at_ms, **dict(zip(labels, key, strict=True))})[
                value_name(ref)
            ] = value
    fields = ["Time", *labels, *(value_name(t["refId"]) for t in targets)]
    organize: dict[str, Any] = next(
        (x["options"] for x in panel.get("transformations", []) if x["id"] == "organize"), {}
    )
    excluded = {k for k, v in organize.get("excludeByName", {}).items() if v}
    order = organize.get("indexByName", {})
    rename = organize.get("renameByName", {})
    # Grafana's organize: fields without an index keep their order after those with one
    shown = sorted((f for f in fields if f not in excluded), key=lambda f: order.get(f, sys.maxsize))
    names = [rename.get(f, f) for f in shown]
    records = list(merged.values())
    sort = (panel.get("options", {}).get("sortBy") or [{}])[0]
    if sort.get("displayName") in names:
        by = shown[names.index(sort["displayName"])]
        records.sort(key=lambda r: _sort_key(r.get(by)), reverse=bool(sort.get("desc")))
    cells = [
        [_cell(r.get(f), _unit(panel, n, f)) for f, n in zip(shown, names, strict=True)] for r in records
    ]
    return Table(names, cells)


def _labels(series: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in series["metric"].items() if k != "__name__"}


def _sort_key(value: Any) -> tuple[int, float, str]:
    if isinstance(value, float | int):
        return (1, float(value), "")
    return (0, 0.0, str(value or ""))


def _cell(value: Any, unit: str) -> str:
    if value is None:
        return ""
    if isinstance(value, float | int):
        return formatted(float(value), unit)
    return str(value)


def _unit(panel: dict[str, Any], name: str, field: str) -> str:
    """The unit Grafana uses for a column: an override by its display name, else the panel's; the Time column
    is a time."""
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        if override["matcher"]["options"] == name:
            for prop in override["properties"]:
                return str(prop["value"])
    if field == "Time":
        return "dateTimeAsIso"
    return str(panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "none"))


# ------------------------------------------------------------------------------------------------------ drawing


@dataclass
class Drawn:
    title: str
    type: str
    shows: str  # what the panel showed, in words (the test and the console read it)
    rows: list[dict[str, str]]  # a table's rows, column -> cell as drawn (empty for other panels)


Shown = tuple[str, list[dict[str, str]]]  # what a panel showed in words, and a table's rows


class Prometheus:
    """A real Prometheus's HTTP API over [start, end]."""

    def __init__(self, url: str, *, start: float, end: float, step: float, rate_interval: str) -> None:
        self.url, self.start, self.end, self.step, self.rate_interval = (
            url.rstrip("/"),
            start,
            end,
            step,
            rate_interval,
        )

    def _get(self, path: str, params: dict[str, Any]) -> Result:
        with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(params)}", timeout=30) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]["result"]  # type: ignore[no-any-return]

    def instant(self, expr: str) -> Result:
        return self._get("/api/v1/query", {"query": self._q(expr), "time": self.end})

    def ranged(self, expr: str) -> Result:
        params = {"query": self._q(expr), "start": self.start, "end": self.end, "step": self.step}
        return self._get("/api/v1/query_range", params)

    def _q(self, expr: str) -> str:
        return substitute(expr, rate_interval=self.rate_interval)


def render(board: dict[str, Any], source: Source, out: Path, *, start: float, end: float) -> list[Drawn]:
    """Draw every panel of `board` from `source` into `out` (PNG); one Drawn per panel, in the JSON's order.

    Raises:
        Unsupported: the JSON leaves Grafana's model, or a panel cannot be drawn as Grafana would.
    """
    problems = schema_problems(board) + [p for panel in board["panels"] for p in undrawable(panel)]
    if problems:
        raise Unsupported("; ".join(problems))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid_rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in board["panels"])
    height_px = HEADER_PX + grid_rows * (ROW_PX + GAP_PX)
    fig = plt.figure(figsize=(WIDTH_PX / DPI, height_px / DPI), dpi=DPI, facecolor=CANVAS)
    span = f"{datetime.fromtimestamp(start, UTC):%Y-%m-%d %H:%M:%S} to {datetime.fromtimestamp(end, UTC):%H:%M:%S} UTC"
    fig.text(
        8 / WIDTH_PX,
        1 - 28 / height_px,
        f"{board['title']}    {span}    cluster: All    (deploy/grafana/txnwatch.json drawn by render.py)",
        color=TEXT,
        fontsize=13,
    )
    drawn = []
    for panel in board["panels"]:
        box = _Box(fig, panel, height_px)
        draw = DRAWERS[panel["type"]]
        shows, rows = draw(box, panel, source, start, end)
        drawn.append(Drawn(panel["title"], panel["type"], shows, rows))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, facecolor=CANVAS)
    plt.close(fig)
    return drawn


class _Box:
    """A panel's place on the figure, in pixels of Grafana's grid, with its header drawn."""

    def __init__(self, fig: Any, panel: dict[str, Any], height_px: int) -> None:
        g = panel["gridPos"]
        col_px = (WIDTH_PX - GAP_PX) / COLUMNS
        self.fig, self.height_px = fig, height_px
        self.left = GAP_PX + g["x"] * col_px
        self.width = g["w"] * col_px - GAP_PX
        self.top = HEADER_PX + g["y"] * (ROW_PX + GAP_PX)
        self.height = g["h"] * ROW_PX + (g["h"] - 1) * GAP_PX
        frame = fig.add_axes(self.rect(self.left, self.top, self.width, self.height), facecolor=PANEL)
        frame.set_xticks([])
        frame.set_yticks([])
        for side in frame.spines.values():
            side.set_color(BORDER)
        links = panel.get("links", [])
        # Grafana's header: the title cut with an ellipsis where the panel ends, a link icon when it has links
        icon = "  \u2197" if links else ""
        fits = int((self.width - 16) / TITLE_CHAR_PX) - len(icon)
        title = panel["title"] if len(panel["title"]) <= fits else panel["title"][: fits - 1] + "\u2026"
        fig.text(
            *self.point(self.left + 8, self.top + 20), title + icon, color=TEXT, fontsize=10, weight="bold"
        )

    def rect(self, left: float, top: float, width: float, height: float) -> tuple[float, float, float, float]:
        return (
            left / WIDTH_PX,
            1 - (top + height) / self.height_px,
            width / WIDTH_PX,
            height / self.height_px,
        )

    def point(self, x: float, y: float) -> tuple[float, float]:
        return x / WIDTH_PX, 1 - y / self.height_px

    def body(self, *, left_pad: float = 8, bottom_pad: float = 8, right_pad: float = 8) -> Any:
        """Axes over the panel's content area (below the header)."""
        ax = self.fig.add_axes(
            self.rect(
                self.left + left_pad,
                self.top + TITLE_PX,
                self.width - left_pad - right_pad,
                self.height - TITLE_PX - bottom_pad,
            ),
            facecolor=PANEL,
        )
        for side in ax.spines.values():
            side.set_visible(False)
        return ax


def _series(values: Sequence[Sequence[Any]], start: float, end: float, step: float) -> list[float | None]:
    """A range answer on the query's steps, None where Prometheus returned no sample (a gap)."""
    by_ts = {round(float(ts), 3): sample(v) for ts, v in values}
    n = round((end - start) / step) + 1
    return [by_ts.get(round(start + i * step, 3)) for i in range(n)]


def draw_stat(box: _Box, panel: dict[str, Any], source: Source, start: float, end: float) -> Shown:
    """Grafana's stat: the reduced value of each series, the background coloured by its value mapping or
    threshold, the sparkline of the range under it; noValue (and the `null` mapping) without any series."""
    defaults = panel["fieldConfig"]["defaults"]
    options = panel.get("options", {})
    calc = options.get("reduceOptions", {}).get("calcs", ["lastNotNull"])[0]
    found = [s for t in panel["targets"] for s in source.ranged(t["expr"])]
    unit = defaults.get("unit", "none")
    shown = []
    cells: list[tuple[float | None, list[tuple[float, float]]]] = [
        (
            reduced([sample(v) for _, v in s["values"]], calc),
            [(float(t), float(v)) for t, v in s["values"] if sample(v) is not None],
        )
        for s in found
    ] or [(None, [])]
    ax = box.body(left_pad=0, bottom_pad=0, right_pad=0)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlim(0, len(cells))
    ax.set_ylim(0, 1)
    for i, (value, points) in enumerate(cells):
        text = defaults.get("noValue", "No data") if value is None else formatted(value, unit)
        color = threshold_color(defaults["thresholds"]["steps"], value)
        hit = mapped(defaults.get("mappings", []), value)
        if hit is not None:  # as Grafana: a value mapping's text and colour win over the thresholds
            text, color = hit.get("text", text), hit.get("color", color)
        fill = COLORS.get(color, color) if options.get("colorMode") == "background" else PANEL
        ax.axvspan(i, i + 1, color=fill)
        if options.get("graphMode") == "area" and len(points) > 1:
            ys = [p[1] for p in points]
            low, high = min(ys), max(ys)
            span = (high - low) or 1.0
            xs = [i + (p[0] - start) / max(end - start, 1.0) for p in points]
            ax.fill_between(xs, 0, [0.05 + 0.3 * (y - low) / span for y in ys], color="white", alpha=0.18)
        size = 26 if len(text) <= 8 else max(9, int(26 * 8 / len(text)))
        ax.text(i + 0.5, 0.55, text, color="white", fontsize=size, ha="center", va="center", weight="bold")
        shown.append(text)
    return ", ".join(shown), []


def draw_table(box: _Box, panel: dict[str, Any], source: Source, start: float, end: float) -> Shown:
    """Grafana's table: a header row and one row per merged result, columns as wide as their text; the
    panel's noValue when there is no row."""
    t = table(panel, source, end * 1000)
    ax = box.body()
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    if not t.rows:
        none = panel["fieldConfig"]["defaults"].get("noValue", "No data")
        ax.text(0.5, 0.5, none, color=WEAK, ha="center", va="center", fontsize=11)
        return f"{len(t.columns)} columns {t.columns}, no row: {none}", []
    chars = [max(len(x) for x in [n, *(r[i] for r in t.rows)]) + 3 for i, n in enumerate(t.columns)]
    total = sum(chars)
    line_px = 30
    height_px = box.height - TITLE_PX - 8
    fontsize = max(6.5, min(9.5, (box.width - 16) / total / 0.62 * 72 / DPI))
    visible = max(0, int(height_px // line_px) - 1)
    for r, cells in enumerate([t.columns, *t.rows[:visible]]):
        y = 1 - (r + 0.5) * line_px / height_px
        x = 0.0
        for i, text in enumerate(cells):
            ax.text(
                x + 0.005,
                y,
                text,
                color=WEAK if r == 0 else TEXT,
                fontsize=fontsize,
                va="center",
                weight="bold" if r == 0 else "normal",
                clip_on=True,
            )
            x += chars[i] / total
        ax.axhline(1 - (r + 1) * line_px / height_px, color=BORDER, linewidth=0.8)
    hidden = len(t.rows) - visible
    if hidden > 0:  # Grafana scrolls; the picture says how many rows it leaves below
        ax.text(0.99, 0.02, f"{hidden} more row(s)", color=WEAK, ha="right", va="bottom", fontsize=8)
    records = [dict(zip(t.columns, r, strict=True)) for r in t.rows]
    return f"{len(t.rows)} row(s) {records}", records


def draw_timeseries(box: _Box, panel: dict[str, Any], source: Source, start: float, end: float) -> Shown:
    """Grafana's time series: each target's range series (stacked when saved so), y from the panel's min, the
    unit on the axis, the legend as a table on the right with its calcs."""
    import matplotlib.dates as mdates
    from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator

    defaults = panel["fieldConfig"]["defaults"]
    custom = defaults.get("custom", {})
    unit = defaults.get("unit", "none")
    step = source.step
    found = [(t, s) for t in panel["targets"] for s in source.ranged(t["expr"])]
    names = [legend(t.get("legendFormat", ""), s["metric"]) for t, s in found]
    ys = [_series(s["values"], start, end, step) for _, s in found]
    legend_options = panel.get("options", {}).get("legend", {})
    calcs = legend_options.get("calcs", [])
    on_right = legend_options.get("showLegend", True) and legend_options.get("placement") == "right"
    legend_px = min(box.width * 0.45, 40 + 7 * max([len(n) for n in names] + [10]) + 60 * len(calcs))
    ax = box.body(left_pad=56, bottom_pad=24, right_pad=8 + (legend_px if on_right else 0))
    xs = [datetime.fromtimestamp(start + i * step, UTC) for i in range(len(ys[0]) if ys else 0)]
    stacked = custom.get("stacking", {}).get("mode") == "normal"
    alpha = custom.get("fillOpacity", 0) / 100
    width = custom.get("lineWidth", 1)
    base = [0.0] * len(xs)
    peak = 0.0
    for i, series in enumerate(ys):
        color = PALETTE[i % len(PALETTE)]
        top = [(b + v) if stacked and v is not None else v for b, v in zip(base, series, strict=True)]
        line = [float("nan") if v is None else v for v in top]
        ax.plot(xs, line, color=color, linewidth=width)
        if alpha:
            floor = base if stacked else [0.0] * len(xs)
            ax.fill_between(
                xs,
                floor,
                [f if v != v else v for f, v in zip(floor, line, strict=True)],
                color=color,
                alpha=alpha,
                linewidth=0,
            )
        if stacked:
            base = [b + (v or 0.0) for b, v in zip(base, series, strict=True)]
        peak = max([peak, *(v for v in top if v is not None)])
    low = defaults.get("min", 0)
    ax.set_ylim(low, peak * 1.1 if peak > low else low + 1)
    ax.set_xlim(datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC))
    ax.set_xticks(time_ticks(start, end, max(3, panel["gridPos"]["w"] // 2)))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=UTC))  # type: ignore[no-untyped-call]  # unannotated
    if unit == "s" and peak > 120:  # Grafana's time axis steps: whole minutes and hours
        ax.yaxis.set_major_locator(MultipleLocator(next((n for n in NICE_S if peak / n <= 5), NICE_S[-1])))
    else:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: formatted(v, unit)))
    ax.tick_params(colors=WEAK, labelsize=7.5, length=0)
    ax.grid(color=BORDER, linewidth=0.6)
    if not found:  # Grafana draws no axes without data, only the words
        ax.set_axis_off()
        ax.text(
            0.5, 0.5, "No data", color=WEAK, ha="center", va="center", transform=ax.transAxes, fontsize=11
        )
        return "no series", []
    rows = [[n, *(_calc(v, c, unit) for c in calcs)] for n, v in zip(names, ys, strict=True)]
    if on_right:
        _legend_table(box, legend_px, ["Name", *(CALC_NAMES[c] for c in calcs)], rows)
    return f"{len(found)} series: " + "; ".join(" ".join(r) for r in rows), []


def time_ticks(start: float, end: float, most: int) -> list[datetime]:
    """Round times across [start, end] as Grafana's time axis marks them: the smallest of its intervals that
    leaves at most `most` marks."""
    interval = next((i for i in TICK_S if (end - start) / i <= most), TICK_S[-1])
    first = math.ceil(start / interval) * interval
    return [datetime.fromtimestamp(t, UTC) for t in range(int(first), int(end) + 1, interval)]


def _calc(values: Sequence[float | None], calc: str, unit: str) -> str:
    value = reduced(values, calc)
    return "" if value is None else formatted(value, unit)


def _legend_table(box: _Box, width_px: float, header: list[str], rows: list[list[str]]) -> None:
    left = box.left + box.width - width_px
    calc_px = 60.0
    name_px = width_px - 8 - calc_px * (len(header) - 1)
    line_px = 15
    for r, cells in enumerate([header, *rows]):
        y = box.top + TITLE_PX + 8 + r * line_px
        if y > box.top + box.height - 8:
            break
        if r:
            box.fig.patches.append(_swatch(box, left, y, PALETTE[(r - 1) % len(PALETTE)]))
        name = (
            cells[0]
            if len(cells[0]) * 5.6 < name_px - 14
            else cells[0][: int((name_px - 14) / 5.6) - 1] + "\u2026"
        )
        box.fig.text(*box.point(left + 14, y + 4), name, color=WEAK if r == 0 else TEXT, fontsize=7.5)
        for i, text in enumerate(cells[1:]):
            box.fig.text(
                *box.point(left + name_px + (i + 1) * calc_px, y + 4),
                text,
                color=WEAK if r == 0 else TEXT,
                fontsize=7.5,
                ha="right",
            )


def _swatch(box: _Box, left: float, y: float, color: str) -> Any:
    from matplotlib.patches import Rectangle

    x0, y0 = box.point(left, y + 2)
    return Rectangle((x0, y0), 10 / WIDTH_PX, 3 / box.height_px, color=color, transform=box.fig.transFigure)


DRAWERS: dict[str, Callable[[_Box, dict[str, Any], Source, float, float], Shown]] = {
    "stat": draw_stat,
    "table": draw_table,
    "timeseries": draw_timeseries,
}


def render_file(
    path: Path, prometheus_url: str, out: Path, *, start: float, end: float, step: float, rate_interval: str
) -> list[Drawn]:
    """Draw the dashboard JSON at `path` from the Prometheus at `prometheus_url` into `out`."""
    board = json.loads(path.read_text())
    source = Prometheus(prometheus_url, start=start, end=end, step=step, rate_interval=rate_interval)
    return render(board, source, out, start=start, end=end)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    parser.add_argument(
        "--json", type=Path, default=JSON_PATH, help="the dashboard JSON (default: txnwatch's)"
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="time range ending now")
    args = parser.parse_args(argv)
    end = time.time()
    start = end - args.minutes * 60
    step = max(args.minutes * 60 / 240, 1.0)
    for d in render_file(
        args.json, args.prometheus, args.out, start=start, end=end, step=step, rate_interval="1m"
    ):
        print(f"{d.title} [{d.type}]: {d.shows}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
