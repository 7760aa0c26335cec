"""The part of a long journal the run page shows: a window of step positions around the current step.

A run of 10k steps cannot be drawn or listed whole, and a cap that silently shows the first 200
rows lies about the rest. So the timeline and the Trace, Checkpoints and Events tabs all show the
same window of positions (by default ``RADIUS`` steps either side of the step the page opened at),
with links to move it and the totals beside it. Every read here is an indexed range or COUNT on
(run, position) or (run, seq): the page's queries do not grow with the journal.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, Max, Min, Q
from django.db.models.functions import Coalesce

from journal.models import Checkpoint, SessionEvent, TraceSpan

RADIUS = 50  # steps either side of the current one
MAX_WIDTH = 1000  # a window wider than this is narrowed (a hand-made URL cannot ask for the whole journal)
AGGREGATE_ABOVE = 300  # more spans than this in the window: one timeline row per step name, not per span
TAB_ROWS = 200  # rows a tab lists of its window


@dataclass(frozen=True)
class Window:
    """Step positions ``lo``..``hi`` (1-based, inclusive) of a run with ``total`` steps."""

    lo: int
    hi: int
    total: int

    @property
    def width(self) -> int:
        return self.hi - self.lo + 1

    @property
    def whole(self) -> bool:
        return self.lo <= 1 and self.hi >= self.total

    @property
    def at_start(self) -> bool:
        return self.lo <= 1

    @property
    def at_end(self) -> bool:
        return self.hi >= self.total

    def moved(self, lo: int) -> Window:
        """The same width starting at ``lo``, kept inside the run."""
        lo = max(1, min(lo, self.total - self.width + 1))
        return Window(lo, min(self.total, lo + self.width - 1), self.total)

    @property
    def first(self) -> Window:
        return self.moved(1)

    @property
    def last(self) -> Window:
        return self.moved(self.total)

    @property
    def earlier(self) -> Window:
        return self.moved(self.lo - self.width)

    @property
    def later(self) -> Window:
        return self.moved(self.hi + 1)


def window_for(total: int, center: int, lo: int | None = None, hi: int | None = None,
               radius: int = RADIUS) -> Window:
    """The window the page asked for (``lo``..``hi``, clamped and narrowed) or ``radius`` steps around
    ``center``; at either end of the run the window slides inward so it keeps its width."""
    total = max(total, 0)
    if total == 0:
        return Window(1, 0, 0)
    if lo is not None or hi is not None:
        lo = max(1, min(lo if lo is not None else 1, total))
        hi = max(lo, min(hi if hi is not None else total, total, lo + MAX_WIDTH - 1))
        return Window(lo, hi, total)
    width = min(total, 2 * radius + 1)
    center = max(1, min(center, total))
    return Window(1, width, total).moved(center - radius)


def _in(qs, window: Window):
    return qs.filter(position__gte=window.lo, position__lte=window.hi)


def timeline_rows(run_id, window: Window) -> tuple[list[dict], int, bool]:
    """The timeline's rows for the window, its span count, and whether the rows are aggregated.

    Up to ``AGGREGATE_ABOVE`` spans: one row per span in start order. More: one row per step name
    (first start to last end, with the count, the errors and the first position), grouped by the database.
    """
    spans = _in(TraceSpan.objects.filter(run_id=run_id), window)
    count = spans.count()
    if count <= AGGREGATE_ABOVE:
        rows = list(spans.order_by("started_at", "id").values(
            "name", "kind", "position", "attempt", "status", "started_at", "ended_at", "duration_ms"))
        return rows, count, False
    groups = spans.values("name", "kind").annotate(
        first_start=Min("started_at"), last_end=Max(Coalesce("ended_at", "started_at")), count=Count("id"),
        errors=Count("id", filter=Q(status="error")), first_position=Min("position"),
        last_position=Max("position"),
    ).order_by("first_start")
    rows = [{"name": g["name"], "kind": g["kind"], "started_at": g["first_start"], "ended_at": g["last_end"],
             "count": g["count"], "errors": g["errors"], "position": g["first_position"],
             "last_position": g["last_position"]} for g in groups]
    return rows, count, True


def trace_rows(run_id, window: Window) -> list[TraceSpan]:
    """The Trace tab: the window's first ``TAB_ROWS`` spans by position."""
    return list(_in(TraceSpan.objects.filter(run_id=run_id), window).order_by("position", "started_at", "id")
                [:TAB_ROWS])


def checkpoint_rows(run_id, window: Window) -> list[Checkpoint]:
    """The Checkpoints tab: the window's first ``TAB_ROWS`` checkpoint decisions."""
    return list(_in(Checkpoint.objects.filter(run_id=run_id), window).defer("manifest", "state")
                .order_by("position", "id")[:TAB_ROWS])


def event_bounds(run_id, window: Window, newest: int) -> tuple[int, int]:
    """The seq range (after, until] of the events that belong to the window's steps: from just before
    the first event of step ``lo`` (the very start when ``lo`` is 1) to just before the first event of
    step ``hi``+1 (the newest event when the window reaches the end), lifecycle events between them included."""
    positioned = SessionEvent.objects.filter(run_id=run_id, position__isnull=False)
    after = 0
    if not window.at_start:
        first = positioned.filter(position__gte=window.lo).order_by("position", "seq").values_list("seq", flat=True)
        after = (first.first() or 1) - 1
    until = newest
    if not window.at_end:
        beyond = positioned.filter(position__gt=window.hi).order_by("position", "seq").values_list("seq", flat=True)
        until = (beyond.first() or newest + 1) - 1
    return after, until
