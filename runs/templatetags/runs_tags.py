"""Template helpers: JSON as a collapsible tree, sizes, durations, status badges.

Everything here escapes what it is given (agent and tool output is untrusted) and builds HTML
with format_html, never string concatenation of raw values.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django import template
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

COLLAPSE_BYTES = 2_000  # payloads bigger than this start collapsed, with their size
MAX_TREE_NODES = 2_000  # beyond this the tree stops and says so


def _size(value: Any) -> int:
    try:
        return len(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return len(str(value))


@register.filter
def human_bytes(n: Any) -> str:
    try:
        n = float(n)
    except (TypeError, ValueError):
        return ""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


@register.filter
def human_duration(value: Any) -> str:
    if value is None or value == "":
        return "—"
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value) / 1000.0
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


@register.simple_tag
def json_tree(value: Any, open_levels: int = 1) -> SafeString:
    """Render JSON as nested <details>; big values start collapsed with a size note."""
    budget = [MAX_TREE_NODES]
    size = _size(value)
    tree = _node(value, 0, open_levels, budget)
    if size > COLLAPSE_BYTES:
        return format_html('<details class="big"><summary>{} — show</summary>{}</details>',
                           human_bytes(size), tree)
    return tree


def _scalar(value: Any) -> SafeString:
    if value is None:
        return mark_safe('<span class="j-null">null</span>')
    if isinstance(value, bool):
        return format_html('<span class="j-bool">{}</span>', "true" if value else "false")
    if isinstance(value, int | float):
        return format_html('<span class="j-num">{}</span>', value)
    text = str(value)
    if "\n" in text or len(text) > 120:
        return format_html('<pre class="j-str">{}</pre>', text)
    return format_html('<span class="j-str">"{}"</span>', text)


def _node(value: Any, depth: int, open_levels: int, budget: list[int]) -> SafeString:
    budget[0] -= 1
    if budget[0] < 0:
        return mark_safe('<span class="muted">… (truncated)</span>')
    if isinstance(value, dict) and value:
        items = format_html_join("", "<li><span class=\"j-key\">{}</span>: {}</li>",
                                 ((k, _node(v, depth + 1, open_levels, budget)) for k, v in value.items()))
        return format_html('<details class="j"{}><summary>{{…}} {} keys</summary><ul>{}</ul></details>',
                           " open" if depth < open_levels else "", len(value), items)
    if isinstance(value, list) and value:
        items = format_html_join("", "<li><span class=\"j-key\">{}</span>: {}</li>",
                                 ((i, _node(v, depth + 1, open_levels, budget)) for i, v in enumerate(value)))
        return format_html('<details class="j"{}><summary>[…] {} items</summary><ul>{}</ul></details>',
                           " open" if depth < open_levels else "", len(value), items)
    if isinstance(value, dict):
        return mark_safe('<span class="j-null">{}</span>')
    if isinstance(value, list):
        return mark_safe('<span class="j-null">[]</span>')
    return _scalar(value)


@register.filter
def jsonish(value: Any) -> str:
    """Compact JSON for one table cell (escaped by the template like any text)."""
    if value is None:
        return ""
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 160 else text[:157] + "…"


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False, indent=2)


@register.filter
def percent(progress: Any) -> int | None:
    if not isinstance(progress, dict):
        return None
    try:
        done, total = int(progress.get("done") or 0), int(progress.get("total") or 0)
    except (TypeError, ValueError):
        return None
    return max(0, min(100, round(100 * done / total))) if total else None


ACTION_LABELS = {
    "approval_accept": "approval: accepted", "approval_edit": "approval: edited and accepted",
    "approval_reject": "approval: rejected", "approval_respond": "approval: responded",
    "rerun": "re-run from a step", "fork": "fork", "resolve_effect": "resolve an in-doubt effect",
    "replay_check": "replay check", "pause_agent": "pause agent", "unpause_agent": "unpause agent",
}


@register.filter
def action_label(action: Any) -> str:
    """An audited action's name as people read it ("approval_accept" -> "approval: accepted")."""
    text = str(action)
    return ACTION_LABELS.get(text, text.replace("_", " "))


@register.filter
def diff_lines(diff: Any) -> list[tuple[str, str]]:
    """A unified diff as (css class, line) pairs, so additions and removals can be coloured."""
    out = []
    for line in str(diff or "").splitlines():
        if line.startswith(("+++", "---")):
            cls = "dl-file"
        elif line.startswith("@@"):
            cls = "dl-hunk"
        elif line.startswith("+"):
            cls = "dl-add"
        elif line.startswith("-"):
            cls = "dl-del"
        else:
            cls = "dl-ctx"
        out.append((cls, line))
    return out


@register.filter
def split_words(text: Any) -> list[str]:
    return str(text).split()


@register.filter
def pair(first: Any, second: Any) -> tuple:
    """``a|pair:b`` -> (a, b): loop over two sides with one cell template."""
    return (first, second)


@register.filter
def thousands(value: Any) -> str:
    """1234 -> "1,234" (counts in labels); anything else as it is."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


@register.filter
def progress_of(run: Any) -> dict | None:
    """What a progress bar shows for a run: ``{"pct": 0..100 or None, "text": "37 / 120 contracts"}``.

    A completed run is complete: its bar is full and its count reads total of total, whatever the last
    ``set_progress`` before the end said. None when the run never reported progress."""
    progress = getattr(run, "progress", None)
    if not isinstance(progress, dict):
        return None
    try:
        done = int(progress.get("done") or 0)
        total = int(progress["total"]) if progress.get("total") not in (None, "") else None
    except (TypeError, ValueError):
        return None
    label = str(progress.get("label") or "")
    if getattr(run, "status", "") == "completed":
        done = total if total else done
        pct = 100
    else:
        pct = max(0, min(100, round(100 * done / total))) if total else None
    count = f"{done:,} / {total:,}" if total else f"{done:,}"
    return {"pct": pct, "text": f"{count} {label}".strip()}


@register.filter
def short_id(value: Any) -> str:
    return str(value)[:8]
