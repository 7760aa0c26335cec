"""Read-side queries for the dashboard pages: filters, keyset pagination, per-page data in a fixed
number of queries (never one per row).

Keyset pagination: a page is "the next N rows after (sort value, id)"; it never counts the whole
table and never uses OFFSET, so page 5,000 of 100k runs costs what page 1 does.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from journal.models import LIVE_STATUSES, Run, RunStatus

PAGE_SIZE = 50
# Sortable columns: all NOT NULL, so (value, id) is a total order the keyset can walk.
SORTS = {"created": "created_at", "agent": "agent", "status": "status", "steps": "steps", "tokens": "tokens",
         "cost": "cost"}
DEFAULT_SORT = "-created"


class FilterError(ValueError):
    """A filter value the user typed that cannot be understood; shown next to the form."""


@dataclass
class RunFilter:
    status: list[str] = field(default_factory=list)
    agent: str = ""
    version: str = ""
    since: datetime | None = None
    until: datetime | None = None
    q: str = ""  # the free text left once the key:value terms are taken out
    search: str = ""  # what was typed in the search box, as typed
    terms: list[tuple[str, str]] = field(default_factory=list)  # key:value terms found in q (AND)
    sort: str = DEFAULT_SORT
    errors: list[str] = field(default_factory=list)

    @classmethod
    def from_query(cls, params) -> RunFilter:
        f = cls()
        valid = set(RunStatus.values)
        for s in params.getlist("status"):
            if s in valid:
                f.status.append(s)
            elif s:
                f.errors.append(f"unknown status {s!r}")
        f.agent = params.get("agent", "").strip()[:200]
        f.version = params.get("version", "").strip()[:64]
        f.search = params.get("q", "").strip()[:200]
        f.q, f.terms = parse_search(f.search, f.errors)
        f.since = _parse_time(params.get("since", ""), "since", f.errors)
        f.until = _parse_time(params.get("until", ""), "until", f.errors, end_of_day=True)
        sort = params.get("sort", DEFAULT_SORT)
        if sort.lstrip("-") in SORTS:
            f.sort = sort
        elif sort:
            f.errors.append(f"cannot sort by {sort!r}")
        return f

    def apply(self, qs: QuerySet) -> QuerySet:
        if self.status:
            qs = qs.filter(status__in=self.status)
        if self.agent:
            qs = qs.filter(agent=self.agent)
        if self.version:
            qs = qs.filter(version=self.version)
        if self.since:
            qs = qs.filter(created_at__gte=self.since)
        if self.until:
            qs = qs.filter(created_at__lte=self.until)
        for key, value in self.terms:
            qs = qs.filter(_term(key, value))
        if self.q:
            text = Q(_in__icontains=self.q) | Q(_out__icontains=self.q) | Q(error__icontains=self.q)
            run_id = _as_uuid(self.q)
            if run_id is not None:
                text |= Q(id=run_id)
            else:
                prefix = id_prefix_range(self.q)
                if prefix is not None:  # the 8-character ids the pages show: an indexed range on the key
                    text |= Q(id__gte=prefix[0], id__lte=prefix[1])
            qs = qs.annotate(_in=Cast("input", TextField()), _out=Cast("output", TextField())).filter(text)
        return qs

    @property
    def column(self) -> str:
        return SORTS[self.sort.lstrip("-")]

    @property
    def descending(self) -> bool:
        return self.sort.startswith("-")


def _as_uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except (ValueError, TypeError):
        return None


_HEX_PREFIX = re.compile(r"[0-9a-f]{4,31}")
SEARCH_KEYS = {
    "status": "the run's status (status:failed)",
    "agent": "the agent's name (agent:triage)",
    "version": "the agent version (version:2)",
    "id": "a run id or its first characters (id:3fa2b1c0)",
    "error": "text in the run's error (error:\"unexpected token\")",
    "step": "ran a step of that name (step:summarize_doc)",
    "failed_step": "failed at a step of that name (failed_step:explode)",
}
_TERM = re.compile(r'(?:^|(?<=\s))([a-z_]+):(?:"([^"]*)"|(\S+))')


def parse_search(text: str, errors: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """Split the search box into key:value terms (ANDed) and the free text that remains.

    An unknown key or a value that cannot be one is a message for the page (``errors``), never a 500."""
    terms: list[tuple[str, str]] = []

    def take(m: re.Match) -> str:
        key, value = m.group(1), (m.group(2) if m.group(2) is not None else m.group(3)).strip()
        if key not in SEARCH_KEYS:
            errors.append(f"unknown search term {key}: (known: {', '.join(SEARCH_KEYS)})")
        elif not value:
            errors.append(f"{key}: needs a value, e.g. {SEARCH_KEYS[key]}")
        elif key == "status" and value not in RunStatus.values:
            errors.append(f"status:{value} is not a status (one of {', '.join(RunStatus.values)})")
        elif key == "id" and _as_uuid(value) is None and id_prefix_range(value) is None:
            errors.append(f"id:{value} is not a run id or the start of one (4 or more hex digits)")
        elif _UNBINDABLE.search(value):
            errors.append(f"{key}: the value holds a character no database can search for")
        else:
            terms.append((key, value[:200]))
        return ""

    rest = _TERM.sub(take, text)
    return " ".join(rest.split()), terms


def _step_named(value: str) -> Q:
    """Step names are dotted paths (tests.agents.demo.explode): the last part is what people type."""
    return Q(step_name=value) | Q(step_name__endswith="." + value)


def _term(key: str, value: str) -> Q:
    from django.db.models import Exists, OuterRef

    from journal.models import EventKind, SessionEvent

    if key == "status":
        return Q(status=value)
    if key == "agent":
        return Q(agent=value)
    if key == "version":
        return Q(version=value)
    if key == "id":
        rid = _as_uuid(value)
        if rid is not None:
            return Q(id=rid)
        low, high = id_prefix_range(value)
        return Q(id__gte=low, id__lte=high)
    if key == "error":
        return Q(error__icontains=value)
    # step / failed_step: an EXISTS probe per candidate run on the journal's (run, position) index
    steps = SessionEvent.objects.filter(_step_named(value), run_id=OuterRef("id"), position__isnull=False,
                                        kind=EventKind.STEP_COMPLETED)
    if key == "failed_step":
        steps = steps.filter(payload__has_key="error")
    return Exists(steps)


def id_prefix_range(text: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The run ids starting with ``text`` (4 to 31 hex digits, dashes ignored) as an inclusive range of
    UUIDs: the same order on PostgreSQL's uuid and SQLite's hex text, so the primary key index serves it."""
    digits = text.strip().lower().replace("-", "")
    if not _HEX_PREFIX.fullmatch(digits):
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def _parse_time(text: str, name: str, errors: list[str], end_of_day: bool = False) -> datetime | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = parse_datetime(text)
    except ValueError:
        value = None
    if value is None:
        day = None
        try:
            day = parse_date(text)
        except ValueError:
            pass
        if day is None:
            errors.append(f"{name}: {text!r} is not a date (use YYYY-MM-DD or YYYY-MM-DDTHH:MM)")
            return None
        value = datetime.combine(day, datetime.max.time() if end_of_day else datetime.min.time())
    try:
        if timezone.is_naive(value):
            value = timezone.make_aware(value)
        value.astimezone(UTC)  # what the database is sent: year 1 at +23:59 is year 0, which no column holds
    except (OverflowError, ValueError):
        errors.append(f"{name}: {text!r} is outside the years a date can have")
        return None
    return value


def encode_cursor(value: Any, run_id: Any) -> str:
    raw = json.dumps([value.isoformat() if isinstance(value, datetime) else str(value), str(run_id)])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(text: str) -> tuple[str, str] | None:
    if not text:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        value, run_id = json.loads(raw)
        return str(value), str(run_id)
    except (ValueError, TypeError, RecursionError):
        raise FilterError(DAMAGED) from None


@dataclass
class RunPage:
    runs: list[Run]
    next_cursor: str = ""
    prev_cursor: str = ""

    @property
    def live_ids(self) -> list[str]:
        return [str(r.id) for r in self.runs if r.status in LIVE_STATUSES]


LIST_FIELDS = ("id", "agent", "version", "status", "steps", "progress", "tokens", "cost", "created_at",
               "started_at", "finished_at", "error", "paused", "parent_id", "forked_from_id", "attention_reason")


DAMAGED = "the page link is damaged; start again from the first page"
_CURSOR_INT = re.compile(r"[0-9]{1,18}")  # steps and tokens: non-negative, within a 64-bit column
_CURSOR_DECIMAL = re.compile(r"-?[0-9]{1,8}(\.[0-9]{1,6})?")  # cost: Decimal(14, 6)
_UNBINDABLE = re.compile("[\x00\ud800-\udfff]")


def _cursor_value(column: str, text: str):
    """The sort value a cursor carries, checked against its column's type: a forged or truncated link
    is a FilterError (a message above the list), never a database error."""
    if column == "created_at":
        try:
            value = parse_datetime(text)
        except ValueError:
            value = None
        if value is None:
            raise FilterError(DAMAGED)
        return timezone.make_aware(value) if timezone.is_naive(value) else value
    if column in ("steps", "tokens"):
        if not _CURSOR_INT.fullmatch(text):
            raise FilterError(DAMAGED)
        return int(text)
    if column == "cost" and not _CURSOR_DECIMAL.fullmatch(text):
        raise FilterError(DAMAGED)
    if _UNBINDABLE.search(text):  # NUL or a lone surrogate: no database accepts it as a parameter
        raise FilterError(DAMAGED)
    return text


def runs_page(f: RunFilter, *, after: str = "", before: str = "", size: int = PAGE_SIZE) -> RunPage:
    """One page of runs in a single query (plus none per row)."""
    column, desc = f.column, f.descending
    qs = f.apply(Run.objects.all()).only(*LIST_FIELDS)
    backwards = bool(before) and not after
    cursor = decode_cursor(before if backwards else after)
    if cursor:
        value, rid = _cursor_value(column, cursor[0]), _as_uuid(cursor[1])
        if rid is None:
            raise FilterError(DAMAGED)
        # walking forward in a descending sort means smaller values, and the reverse
        smaller = desc != backwards
        op = "lt" if smaller else "gt"
        qs = qs.filter(Q(**{f"{column}__{op}": value}) | Q(**{column: value, f"id__{op}": rid}))
    forward_desc = desc != backwards
    order = [f"-{column}", "-id"] if forward_desc else [column, "id"]
    rows = list(qs.order_by(*order)[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    if backwards:
        rows.reverse()
    page = RunPage(rows)
    if rows:
        first, last = rows[0], rows[-1]
        if (more and not backwards) or (backwards and cursor):
            page.next_cursor = encode_cursor(getattr(last, column), last.id)
        if (backwards and more) or (not backwards and cursor):
            page.prev_cursor = encode_cursor(getattr(first, column), first.id)
    return page


def agent_choices() -> list[tuple[str, str]]:
    """(agent, version) pairs known to the harness table: small, so the filter form can list them."""
    from journal.models import Harness

    return sorted(set(Harness.objects.values_list("name", "version")))
