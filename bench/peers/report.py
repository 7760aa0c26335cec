"""bench/RESULTS.md and the chart from one run's results (a plain dict, also saved as JSON).

Pure functions of the results, so the rendering is tested without any peer installed
(tests/test_bench_peers.py). Every number is a median over the rounds with its min-max; every
ratio is taken within the run: durable-ui's median over the floor's, and over the best peer's
(the lowest time or storage, the highest throughput, among LangGraph and DBOS).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

SYSTEMS = ("floor", "durable-ui", "LangGraph", "DBOS")
PEERS = ("LangGraph", "DBOS")
DATABASES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}


@dataclass(frozen=True)
class Stat:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Stat | None:
        return cls(statistics.median(values), min(values), max(values)) if values else None


@dataclass(frozen=True)
class Row:
    label: str
    higher_is_better: bool
    values: dict  # system -> Stat | None
    digits: int = 0

    def ratio_to(self, other: str | tuple) -> float | None:
        """durable-ui's median over ``other``'s (a system, or the best of several)."""
        mine = self.values.get("durable-ui")
        if isinstance(other, tuple):
            theirs = [self.values[s].median for s in other if self.values.get(s)]
            base = (max if self.higher_is_better else min)(theirs) if theirs else None
        else:
            base = self.values[other].median if self.values.get(other) else None
        return mine.median / base if mine and base else None

    def best_peer(self) -> str | None:
        have = [s for s in PEERS if self.values.get(s)]
        if not have:
            return None
        return (max if self.higher_is_better else min)(have, key=lambda s: self.values[s].median)


def _num(x: float, digits: int) -> str:
    return f"{x:,.{digits}f}"


def cell(stat: Stat | None, digits: int = 0) -> str:
    if stat is None:
        return "—"
    return f"{_num(stat.median, digits)} ({_num(stat.low, digits)}–{_num(stat.high, digits)})"


def ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def rows(results: dict) -> list[Row]:
    """The table's rows, in the issue's order, one per workload and database."""
    s = results["samples"]
    p = results["params"]
    out: list[Row] = []

    def stats(table: dict, db: str, key=None) -> dict:
        got = table.get(db, {})
        return {sys: Stat.of(got[sys] if key is None else got[sys].get(key, [])) if sys in got else None
                for sys in SYSTEMS}

    for mode in ("sync", "async", "exit"):
        for db, name in DATABASES.items():
            if db in s["per_step"]:
                out.append(Row(f"µs per step, {mode}, {p['steps']}-step run, {name}", False,
                               stats(s["per_step"], db, mode)))
    for mode in ("sync",):
        for db, name in DATABASES.items():
            if db in s.get("per_step_cpu", {}):
                out.append(Row(f"CPU µs per step, {mode}, {name}", False, stats(s["per_step_cpu"], db, mode)))
            if db in s.get("per_step_server_cpu", {}):
                out.append(Row(f"server CPU µs per step, {mode}, {name}", False,
                               stats(s["per_step_server_cpu"], db, mode)))
    for c in p["concurrency"]:
        for db, name in DATABASES.items():
            if db in s["throughput"]:
                out.append(Row(f"runs/s, {p['runs']} runs × {p['run_steps']} steps, {c} concurrent, {name}", True,
                               stats(s["throughput"], db, str(c)), 1))
            if db in s.get("run_cpu", {}):  # with the cores, what bounds the row above
                out.append(Row(f"CPU ms per run, client + server, {c} concurrent, {name}", False,
                               stats(s["run_cpu"], db, str(c)), 2))
    for db, name in DATABASES.items():
        if db in s.get("storage", {}):
            out.append(Row(f"storage, bytes per payload byte, {p['messages'][-1]} × 1 KiB conversation, {name}",
                           False, {sys: Stat.of([v]) if v is not None else None
                                   for sys, v in _storage_ratio(s["storage"][db]).items()}, 1))
    for db, name in DATABASES.items():
        if db in s.get("recovery", {}):
            rec = s["recovery"][db]
            if all("resumed" in r for rows in rec.values() for r in rows):
                out.append(Row(f"SIGKILL mid-run, restart → resumed (first step began), s, {name}", False,
                               {sys: Stat.of([r["resumed"] for r in rec[sys]]) if sys in rec else None
                                for sys in SYSTEMS}, 2))
            out += _crash_rows(rec, "", "plain steps", name)
        if db in s.get("recovery_effects", {}):  # durable-ui's steps as effects: the peers have no such step
            out += _crash_rows(s["recovery_effects"][db], "effect steps, ", "effect steps", name)
    return out


def _crash_rows(rec: dict, done_label: str, steps: str, name: str) -> list[Row]:
    """A crash's time to done and its duplicates, per system that was crashed."""
    def of(key: str) -> dict:
        return {sys: Stat.of([r[key] for r in rec[sys]]) if sys in rec else None for sys in SYSTEMS}
    return [Row(f"SIGKILL mid-run, restart → run done, {done_label}s, {name}", False, of("seconds"), 2),
            Row(f"duplicate effects after that crash, {steps}, {name}", False, of("duplicates"))]


def _storage_ratio(by_system: dict) -> dict:
    return {sys: (by_system[sys]["rows"][-1]["per_payload_byte"] if sys in by_system else None) for sys in SYSTEMS}


def growth(rows_: list[dict]) -> str:
    """O(n) or O(n²), from the bytes of the two longest conversations (doubling n doubles O(n))."""
    if len(rows_) < 2:
        return ""
    a, b = rows_[-2], rows_[-1]
    exponent = math.log(b["bytes"] / a["bytes"], b["messages"] / a["messages"]) if a["bytes"] else 0
    return f"O(n^{exponent:.1f})" if exponent else ""


def table(results: dict) -> str:
    lines = ["| workload | floor | durable-ui | LangGraph | DBOS | durable-ui ÷ floor | durable-ui ÷ best peer |",
             "|---|---|---|---|---|---|---|"]
    for row in rows(results):
        best = row.best_peer()
        lines.append(f"| {row.label} | " + " | ".join(cell(row.values.get(s), row.digits) for s in SYSTEMS)
                     + f" | {ratio(row.ratio_to('floor'))} | {ratio(row.ratio_to(PEERS))}"
                     + (f" ({best})" if best and row.ratio_to(PEERS) is not None else "") + " |")
    return "\n".join(lines)


def storage_table(results: dict) -> str:
    lines = ["| database | system | messages | bytes on disk | per payload byte | growth |",
             "|---|---|---|---|---|---|"]
    for db, name in DATABASES.items():
        for sys in SYSTEMS:
            got = results["samples"].get("storage", {}).get(db, {}).get(sys)
            if not got:
                continue
            for r in got["rows"]:
                lines.append(f"| {name} | {sys} | {r['messages']} | {r['bytes']:,} | {r['per_payload_byte']:.2f} | "
                             f"{growth(got['rows']) if r is got['rows'][-1] else ''} |")
    return "\n".join(lines)


def environment(env: dict) -> str:
    return "\n".join(f"- {k}: {v}" for k, v in env.items())


def _rounds(p: dict) -> str:
    done = p.get("rounds_done", p["rounds"])
    return str(done) if done >= p["rounds"] else f"{done} (of {p['rounds']} planned; the run was stopped)"


def render(results: dict, method: str) -> str:
    p = results["params"]
    return "\n\n".join([
        "# durable-ui beside its peers",
        f"Produced by `make bench-peers` (`bench/peers/run.py{' --quick' if p.get('quick') else ''}`) on "
        f"{results['env'].get('date', '')}: {_rounds(p)} interleaved rounds, medians with (min–max). "
        "Timings on this shared machine are noisy: read the ratios, which are taken within this one run. "
        "A ratio below 1 means durable-ui's number is the smaller (better for time and storage, worse for "
        "runs/s).",
        "## Results",
        table(results),
        "## Storage growth",
        storage_table(results),
        "## Method",
        method,
        "## Environment",
        environment(results["env"]),
    ]) + "\n"


def chart(results: dict):
    """A plotly figure: one panel per workload, bars per system and database, min–max as error bars."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = [("µs per step, sync", lambda r: r.label.startswith("µs per step, sync")),
              ("runs/s, 1 concurrent", lambda r: r.label.startswith("runs/s") and ", 1 concurrent" in r.label),
              ("runs/s, 8 concurrent", lambda r: r.label.startswith("runs/s") and ", 8 concurrent" in r.label),
              ("restart → done, s", lambda r: r.label.startswith("SIGKILL")),
              ("storage, bytes per payload byte", lambda r: r.label.startswith("storage"))]
    fig = make_subplots(rows=len(panels), cols=1, subplot_titles=[t for t, _ in panels], vertical_spacing=0.06)
    all_rows = rows(results)
    colors = {"floor": "#888", "durable-ui": "#2a6", "LangGraph": "#36c", "DBOS": "#c63"}
    for i, (_, keep) in enumerate(panels, 1):
        chosen = [r for r in all_rows if keep(r)]
        for sys in SYSTEMS:
            xs = [r.label.rsplit(", ", 1)[-1] for r in chosen if r.values.get(sys)]
            st = [r.values[sys] for r in chosen if r.values.get(sys)]
            if not st:
                continue
            fig.add_trace(go.Bar(name=sys, x=xs, y=[s.median for s in st], marker_color=colors[sys],
                                 legendgroup=sys, showlegend=i == 1,
                                 error_y={"type": "data", "symmetric": False,
                                          "array": [s.high - s.median for s in st],
                                          "arrayminus": [s.median - s.low for s in st]}), row=i, col=1)
    if any(r.label.startswith("storage") for r in all_rows):
        fig.update_yaxes(type="log", row=len(panels), col=1)
    fig.update_layout(barmode="group", height=320 * len(panels), title="durable-ui beside DBOS and LangGraph")
    return fig
