"""Plotly figure dicts built by pure functions from plain rows; the page passes them with json_script.

No plotly import here: a figure is a dict ({"data": [...], "layout": {...}}) that plotly.js draws,
so these functions are trivial to test and cost nothing at import.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta

STATUS_COLORS = {
    "pending": "#8a8f98", "running": "#2f7ed8", "suspended": "#a66cd9", "completed": "#2e9e5b",
    "failed": "#d64545", "cancelled": "#6b6f76", "needs_attention": "#e09a1a", "compensating": "#c46f2a",
    "compensated": "#7a5a3a",
}
KIND_COLORS = {"step": "#2f7ed8", "effect": "#c46f2a", "model": "#a66cd9", "tool": "#2e9e5b", "sandbox": "#16998f",
               "wait": "#8a8f98", "compensation": "#7a5a3a", "run": "#444"}

# The title sits at the top left of the figure and the legend on its own line between the title and the
# plot (left-aligned, bottom-anchored at the plot's top edge), so a long legend wraps instead of
# running over the title.
_LAYOUT = {"margin": {"l": 50, "r": 50, "t": 78, "b": 40}, "height": 300, "paper_bgcolor": "rgba(0,0,0,0)",
           "plot_bgcolor": "rgba(0,0,0,0)",
           "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": 1.0, "yanchor": "bottom"}}
# Days are categories: a date axis with one day of data zooms to milliseconds.
_DAY_AXIS = {"type": "category", "automargin": True}


def _layout(title: str, **extra) -> dict:
    layout = {**_LAYOUT, "title": {"text": title, "font": {"size": 14}, "x": 0.02, "xanchor": "left",
                                   "y": 0.98, "yanchor": "top", "yref": "container"},
              "xaxis": dict(_DAY_AXIS)}
    layout.update(extra)
    return layout


def _day(value: date | datetime | str) -> str:
    return value.date().isoformat() if isinstance(value, datetime) else str(value)[:10]


def runs_by_status(rows: Iterable[tuple[date | datetime | str, str, int]]) -> dict:
    """Stacked bars: rows of (day, status, count)."""
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    days: set[str] = set()
    for day, status, n in rows:
        d = _day(day)
        days.add(d)
        counts[status][d] = counts[status].get(d, 0) + int(n)
    x = sorted(days)
    data = [{"type": "bar", "name": s, "x": x, "y": [counts[s].get(d, 0) for d in x],
             "marker": {"color": STATUS_COLORS.get(s, "#999")}} for s in STATUS_COLORS if s in counts]
    return {"data": data, "layout": _layout("Runs by status per day", barmode="stack")}


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = (len(sorted_values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def duration_percentiles(rows: Iterable[tuple[date | datetime | str, float]]) -> dict:
    """p50 and p95 run duration (seconds) per day: rows of (day, seconds)."""
    per_day: dict[str, list[float]] = defaultdict(list)
    for day, seconds in rows:
        per_day[_day(day)].append(float(seconds))
    x = sorted(per_day)
    p50 = [round(_quantile(sorted(per_day[d]), 0.5), 3) for d in x]
    p95 = [round(_quantile(sorted(per_day[d]), 0.95), 3) for d in x]
    return {"data": [{"type": "scatter", "mode": "lines+markers", "name": "p50", "x": x, "y": p50},
                     {"type": "scatter", "mode": "lines+markers", "name": "p95", "x": x, "y": p95}],
            "layout": _layout("Run duration (s)")}


def failure_rate(rows: Iterable[tuple[date | datetime | str, str, int]]) -> dict:
    """Share of finished runs that failed, per day: rows of (day, status, count)."""
    finished: dict[str, int] = defaultdict(int)
    failed: dict[str, int] = defaultdict(int)
    for day, status, n in rows:
        d = _day(day)
        if status in ("completed", "failed", "cancelled", "compensated"):
            finished[d] += int(n)
        if status == "failed":
            failed[d] += int(n)
    x = sorted(finished)
    y = [round(100.0 * failed[d] / finished[d], 1) if finished[d] else 0.0 for d in x]
    return {"data": [{"type": "scatter", "mode": "lines+markers", "name": "failed %", "x": x, "y": y,
                      "line": {"color": STATUS_COLORS["failed"]}}],
            "layout": _layout("Failure rate (% of finished)", yaxis={"rangemode": "tozero"})}


def cost_per_day(rows: Iterable[tuple[date | datetime | str, float, int]]) -> dict:
    """Cost and tokens per day: rows of (day, cost, tokens)."""
    cost: dict[str, float] = defaultdict(float)
    tokens: dict[str, int] = defaultdict(int)
    for day, c, t in rows:
        d = _day(day)
        cost[d] += float(c or 0)
        tokens[d] += int(t or 0)
    x = sorted(cost)
    return {"data": [{"type": "bar", "name": "cost", "x": x, "y": [round(cost[d], 4) for d in x]},
                     {"type": "scatter", "mode": "lines+markers", "name": "tokens", "x": x,
                      "y": [tokens[d] for d in x], "yaxis": "y2"}],
            "layout": _layout("Cost and tokens per day", yaxis={"rangemode": "nonnegative", "automargin": True},
                              yaxis2=_count_axis(max(tokens.values(), default=0)))}


def _count_axis(top: int) -> dict:
    """A right-hand axis of whole numbers that starts at zero: plotly's own ticks for a small range are
    fractions, which an integer format prints as one value repeated (0, 0, 1, 1, 2); and a lone day's
    count, ranged around itself, read 91.27k, 91.2704k, 91.2709k … (``tozero`` keeps zero in view)."""
    axis = {"overlaying": "y", "side": "right", "rangemode": "tozero", "automargin": True, "tickformat": "~s",
            "title": {"text": "tokens"}}
    if top < 10:
        axis.update(range=[0, max(top, 1) * 1.15], dtick=1, tickformat="d")
    return axis


def _plotly_time(value: datetime | str | None) -> str | None:
    """A timestamp as plotly.js reads it: naive UTC with microseconds (it drops a zone suffix unreliably)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    return str(value)


def _ms_between(start: datetime | str, end: datetime | str | None, fallback: float) -> float:
    if isinstance(start, datetime) and isinstance(end, datetime):
        return max((end - start).total_seconds() * 1000.0, fallback)
    return fallback


ROW_PX = 20  # one row per span: every label has room, so plotly never skips one


def waterfall(rows: Iterable[dict], aggregated: bool = False, current: int | None = None) -> dict:
    """A waterfall of a run's spans in time order: one row per span (or, ``aggregated``, per step name),
    a bar from its start to its end, coloured by kind (errors red), its step position in ``customdata``
    so a click can move the stepper there.

    The stepper's ``current`` step is marked: its bars outlined and, span by span, a band over its time.
    ``layout.meta`` carries each step's time range (or each aggregated bar's step range), so the page
    moves the mark when the stepper moves without asking the server for the chart again.

    Span rows: name, kind, position, attempt, status, started_at, ended_at, duration_ms.
    Aggregated rows: name, kind, position, last_position, started_at, ended_at, count, errors.
    """
    rows = sorted(rows, key=lambda r: (_plotly_time(r["started_at"]) or ""))
    labels: list[str] = []
    seen: dict[str, int] = defaultdict(int)
    for r in rows:
        if aggregated:
            label = f"{r.get('name', '')} ×{r.get('count', 0)}"
        else:
            label = f"{r.get('position') or '-'} {r.get('name', '')}"
            if (r.get("attempt") or 1) > 1:
                label += f" (attempt {r['attempt']})"
        seen[label] += 1
        labels.append(label if seen[label] == 1 else f"{label} [{seen[label]}]")  # a category per row
    by_kind: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_kind[r.get("kind") or "step"].append(i)
    data = []
    for kind, idx in by_kind.items():
        items = [rows[i] for i in idx]
        failed = [bool(r.get("errors")) if aggregated else r.get("status") == "error" for r in items]
        if aggregated:
            durations = [_ms_between(r["started_at"], r.get("ended_at"), 0.5) for r in items]
            hover = [f"{r.get('count', 0)} spans, steps {r.get('position')}–{r.get('last_position')}"
                     + (f", {r['errors']} failed" if r.get("errors") else "") for r in items]
        else:
            durations = [max(float(r.get("duration_ms") or 0), 0.5) for r in items]
            hover = [r.get("status") or "" for r in items]
        ranges = [[r.get("position"), r.get("last_position") or r.get("position")] for r in items]
        data.append({
            "type": "bar", "orientation": "h", "name": kind,
            "y": [labels[i] for i in idx], "x": [round(d, 3) for d in durations],
            "base": [_plotly_time(r["started_at"]) for r in items],
            "customdata": [r.get("position") for r in items], "text": hover, "textposition": "none",
            "marker": {"color": ["#d64545" if bad else KIND_COLORS.get(kind, "#999") for bad in failed],
                       "line": {"width": [_mark_width(lo, hi, current) for lo, hi in ranges], "color": MARK_COLOR}},
            "meta": {"ranges": ranges},
            "hovertemplate": "%{y}<br>%{x:,.1f} ms · %{text}<br>click: go to step %{customdata}<extra>"
                             + kind + "</extra>",
        })
    height = max(160, ROW_PX * len(rows) + 90)
    layout = _layout("", height=height, barmode="overlay",
                     margin={"l": 10, "r": 20, "t": 30, "b": 40},
                     xaxis={"type": "date", "automargin": True, "title": {"text": "time (UTC)"}},
                     yaxis={"type": "category", "categoryorder": "array", "categoryarray": labels,
                            "autorange": "reversed", "automargin": True, "tickmode": "array",
                            "tickvals": labels, "ticktext": labels, "tickfont": {"size": 11}},
                     showlegend=len(data) > 1, hovermode="closest", dragmode="zoom")
    # dashboard.js: a click on a bar moves the stepper to its step; a move of the stepper moves the mark
    steps = {} if aggregated else _step_times(rows)
    layout["meta"] = {"click": "step", "current": current, "steps": steps, "band": BAND}
    layout["shapes"] = step_band(steps.get(str(current))) if current is not None else []
    return {"data": data, "layout": layout}


MARK_COLOR = "#ca8a04"  # amber, like the band: visible on the light and the dark theme


def _mark_width(lo: int | None, hi: int | None, current: int | None) -> int:
    return 2 if current is not None and lo is not None and lo <= current <= (hi or lo) else 0


def _step_times(rows: list[dict]) -> dict[str, list[str]]:
    """Each step position's first start and last end among the rows, as plotly times (keys are strings: JSON)."""
    times: dict[str, list] = {}
    for r in rows:
        start = r.get("started_at")
        if r.get("position") is None or not isinstance(start, datetime):
            continue
        end = r.get("ended_at") if isinstance(r.get("ended_at"), datetime) else start
        if end == start and r.get("duration_ms"):
            end = start + timedelta(milliseconds=float(r["duration_ms"]))
        key = str(r["position"])
        if key in times:
            times[key] = [min(times[key][0], start), max(times[key][1], end)]
        else:
            times[key] = [start, end]
    return {k: [_plotly_time(a), _plotly_time(b)] for k, (a, b) in times.items()}


def step_band(times: list[str] | None) -> list[dict]:
    """The shaded band over the current step's time (empty when the step has no span in the chart)."""
    if not times:
        return []
    return [{**BAND, "x0": times[0], "x1": times[1]}]


# The current step's band; dashboard.js draws the same one (from layout.meta.band) when the stepper moves.
BAND = {"type": "rect", "xref": "x", "yref": "paper", "y0": 0, "y1": 1, "layer": "below",
        "fillcolor": "rgba(234, 179, 8, 0.22)", "line": {"width": 1, "color": "rgba(202, 138, 4, 0.9)"}}
