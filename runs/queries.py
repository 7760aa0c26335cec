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
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet, TextField
from django.db.models.functions import Cast
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from journal.models import LIVE_STATUSES, Run, RunStatus, RunStep
from journal.models.run import subject_is

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
    "subject": "the subject the run is linked to, as ctx.set_subject set it (subject:customer-42)",
    "error": "text in the run's error (error:\"unexpected token\")",
    "step": "ran a step of that name (step:summarize_doc)",
    "failed_step": "failed at a step of that name (failed_step:explode)",
    "waited": "time spent suspended: >, <, >=, <= or a range, in s/m/h/d/w (waited:>1h, waited:10m..2h)",
    "cost": "cost in dollars: >, <, >=, <=, = or a range (cost:>0.5, cost:0.1..1)",
    "tokens": "tokens used: >, <, >=, <=, = or a range (tokens:>1000)",
    "created": "created on, before or after a day or time (created:>2026-11-01, created:2026-11-01..2026-11-30)",
}
RANGE_KEYS = ("waited", "cost", "tokens", "created")
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
        elif key in RANGE_KEYS and (problem := _range_problem(key, value)):
            errors.append(problem)
        else:
            terms.append((key, value[:200]))
        return ""

    rest = _TERM.sub(take, text)
    return " ".join(rest.split()), terms


def _term(key: str, value: str) -> Q:
    if key in RANGE_KEYS:
        return _range_q(key, value)
    if key == "status":
        return Q(status=value)
    if key == "agent":
        return Q(agent=value)
    if key == "version":
        return Q(version=value)
    if key == "subject":  # exact, on its index: what an erasure request or a support ticket names
        return subject_is(value)
    if key == "id":
        rid = _as_uuid(value)
        if rid is not None:
            return Q(id=rid)
        low, high = id_prefix_range(value)
        return Q(id__gte=low, id__lte=high)
    if key == "error":
        return Q(error__icontains=value)
    # step / failed_step: the engine's summary of step names. Step names are dotted paths
    # (tests.agents.demo.explode) and the last parts are what people type; the summary holds each name
    # with its dotted tails, so the match is one equality on its unique (name, failed, run) index
    failed = key == "failed_step"
    steps = RunStep.objects.filter(name=value[:200], failed=failed)
    if steps.values("pk")[:COMMON_STEP].count() >= COMMON_STEP:
        # a common name: walk the page's own order and probe the (name, failed, run) index per run,
        # the next matches come within a few rows
        q = Q(Exists(steps.filter(run_id=OuterRef("id"))))
    else:  # a rare one: its few runs by primary key, then sorted (probing every run would find none)
        q = Q(id__in=steps.values("run_id"))
    if failed:  # the step of its latest failure, while it has not completed since
        return q & ~Q(failed_step="")
    return q


# Runs with a step name beyond which a search probes each listed run rather than fetching them all:
# counted on the index, at most this many entries read.
COMMON_STEP = 1000


# -- comparisons: waited:>1h, cost:>0.5, tokens:>1000, created:>2026-11-01, and a..b ranges -----------------
_COMPARISON = re.compile(r"(>=|<=|>|<|=)?(.+)")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")
_DAY = re.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_MAX_COST = Decimal("99999999")
_MAX_TOKENS = 2**63 - 1
_MAX_WAIT = timedelta(days=365 * 100)
_FORMATS = {
    "waited": "a duration such as 90s, 10m, 1h30m, 2d",
    "cost": "a number of dollars such as 0.5",
    "tokens": "a whole number such as 1000",
    "created": "a date or time such as 2026-11-01 or 2026-11-01T09:30",
}


class _Bad(ValueError):
    pass


def _duration(text: str) -> timedelta:
    text = text.strip().lower()
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        seconds = float(text)
    else:
        parts = _DURATION_PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise _Bad
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if seconds > _MAX_WAIT.total_seconds():
        raise _Bad
    return timedelta(seconds=seconds)


def _decimal(text: str) -> Decimal:
    try:
        value = Decimal(text.strip().lstrip("$"))
    except (InvalidOperation, ValueError):
        raise _Bad from None
    if not value.is_finite() or abs(value) > _MAX_COST:
        raise _Bad
    return value


def _integer(text: str) -> int:
    text = text.strip().replace(",", "").replace("_", "")
    if not re.fullmatch(r"[0-9]{1,19}", text) or int(text) > _MAX_TOKENS:
        raise _Bad
    return int(text)


def _moment(text: str) -> tuple[datetime, datetime]:
    """The first and last instant a date or time names (a day covers the whole day)."""
    errors: list[str] = []
    start = _parse_time(text, "created", errors)
    if start is None or errors:
        raise _Bad
    if _DAY.fullmatch(text.strip()):
        return start, start + timedelta(days=1) - timedelta(microseconds=1)
    return start, start


_COLUMNS = {"waited": "waited", "cost": "cost", "tokens": "tokens", "created": "created_at"}


def _bounds(key: str, text: str):
    """(column lookups) for one term value; _Bad when it cannot be one."""
    column = _COLUMNS[key]
    if key == "created":
        def parse(t):
            return _moment(t)
    else:
        one = {"waited": _duration, "cost": _decimal, "tokens": _integer}[key]

        def parse(t):
            v = one(t)
            return v, v
    if ".." in text:
        low_text, high_text = text.split("..", 1)
        lookups = {}
        if low_text.strip() not in ("", "*"):
            lookups[f"{column}__gte"] = parse(low_text)[0]
        if high_text.strip() not in ("", "*"):
            lookups[f"{column}__lte"] = parse(high_text)[1]
        if not lookups:
            raise _Bad
        return lookups
    m = _COMPARISON.fullmatch(text.strip())
    if m is None:
        raise _Bad
    op, rest = m.group(1), m.group(2)
    first, last = parse(rest)
    if op == ">":
        return {f"{column}__gt": last}
    if op == ">=":
        return {f"{column}__gte": first}
    if op == "<":
        return {f"{column}__lt": first}
    if op == "<=":
        return {f"{column}__lte": last}
    if key == "waited" and op is None:  # "waited:1h" reads as "waited an hour or more"
        return {f"{column}__gte": first}
    return {f"{column}__gte": first, f"{column}__lte": last}


def _range_problem(key: str, value: str) -> str:
    try:
        _bounds(key, value)
    except _Bad:
        return (f"{key}:{value} is not understood: use {_FORMATS[key]}, with >, <, >=, <= in front "
                f"or a range a..b, e.g. {SEARCH_KEYS[key].split('(')[-1].rstrip(')')}")
    return ""


def _range_q(key: str, value: str) -> Q:
    return Q(**_bounds(key, value))


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
