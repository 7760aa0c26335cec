"""The engine's hot queries, compiled once: what a run's life costs in CPU is mostly Django compiling SQL.

Django builds and compiles a queryset's SQL anew every time it runs. For the few statements every run
executes (the claim, the status moves, loading the journal, creating the run) that compilation is most
of the call: the claim's candidate query cost 4.7 ms of CPU through the ORM against 0.19 ms for the
same SQL run directly (measured on this machine under load; the ratio is what matters).

``FrozenQuery`` keeps the ORM as the one definition of a query: it builds the queryset once per
database vendor with sentinel values standing in for the ones that change (a time, a run id), finds
where Django placed each sentinel among the compiled parameters, and binds fresh values there on every
later call. ``update`` and ``insert`` write a model's columns with cached SQL, preparing each value
through its field exactly as the ORM would. Anything they do not handle (an F expression, a lookup
other than equality and ``__in``) goes through the ORM as before.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable, Hashable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import DEFAULT_DB_ALIAS, connection, connections, models, transaction
from django.db.models.expressions import Combinable
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from journal.store import prepared

SENTINEL_TIME = datetime(2001, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)
SENTINEL_EARLIER = datetime(2001, 2, 3, 4, 5, 5, 123456, tzinfo=UTC)  # a second time in one query
SENTINEL_UUID = uuid.UUID("5e471ae1-0000-4000-8000-00000000f00d")
SENTINEL_TEXT = "5e471ae1-frozen-query-text"


def _adapter(sentinel: Any) -> Callable[[Any], Any]:
    """How Django prepares a value of the sentinel's kind as a query parameter on this database."""
    if isinstance(sentinel, datetime):
        return connection.ops.adapt_datetimefield_value
    if isinstance(sentinel, uuid.UUID):
        if connection.features.has_native_uuid_field:
            return lambda value: value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
        return lambda value: (value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))).hex
    return lambda value: value


class FrozenQuery:
    """A ``values()`` queryset compiled once per vendor and variant, run with fresh values.

    ``build(variant, **sentinels)`` returns the queryset; ``fields`` name the columns it selects,
    in order. A variant (a LIMIT, whether a filter applies) is part of the SQL, so each compiles once.
    """

    def __init__(self, model: type[models.Model], fields: Sequence[str], build: Callable[..., models.QuerySet],
                 *, prepare: bool = True, literals: bool = False, **sentinels: Any):
        self.model = model
        self.fields = tuple(fields)
        self.build = build
        self.sentinels = sentinels
        self.prepare = prepare  # False: PostgreSQL plans each run for its values (see prepared.cursor)
        self.literals = literals  # the query's fixed words written into its SQL (see _inline_words)
        self._compiled: dict[tuple, tuple[str, list]] = {}
        self._convert = [_from_db(_field(model, name)) for name in self.fields]

    def _compile(self, variant: Hashable, needed: Iterable[str]) -> tuple[str, list]:
        qs = self.build(variant, **self.sentinels)
        if qs.query.select_for_update:  # Django compiles a locking query only inside a transaction (no SQL runs)
            with transaction.atomic(using=qs.db):
                sql, params = qs.query.get_compiler(using=qs.db).as_sql()
        else:
            sql, params = qs.query.get_compiler(using=qs.db).as_sql()
        slots: list = []
        marks = {name: (_adapter(value), value) for name, value in self.sentinels.items()}
        prepared = {name: adapt(value) for name, (adapt, value) in marks.items()}
        for param in params:
            slot = next((name for name, value in prepared.items() if type(param) is type(value) and param == value),
                        None)
            slots.append((slot, marks[slot][0]) if slot else (None, param))
        missing = set(needed) - {slot for slot, _ in slots if slot}
        if missing:  # a value given was not found in the SQL: it would be ignored, so refuse rather than guess
            raise ValueError(f"{self.model.__name__} query left out {sorted(missing)}")
        return _inline_words(sql, slots) if self.literals else (sql, slots)

    def statement(self, variant: Hashable = None, **values: Any) -> tuple[str, list]:
        """The compiled SQL and its parameters with these values, for a caller that builds on it."""
        key = (connection.vendor, variant)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = self._compile(variant, values)
        sql, slots = compiled
        return sql, [adapt(values[slot]) if slot else adapt for slot, adapt in slots]

    def rows(self, variant: Hashable = None, **values: Any) -> list[dict]:
        sql, params = self.statement(variant, **values)
        with prepared.cursor(self.prepare) as cursor:  # PostgreSQL: bound, and planned once unless told not to
            cursor.execute(sql, params)
            return self.convert(cursor.fetchall())

    def convert(self, fetched: Iterable[Sequence]) -> list[dict]:
        """Rows of this query's columns as the ORM would give them (a caller's own statement may return them)."""
        fields, convert = self.fields, self._convert
        return [{name: conv(value) for name, conv, value in zip(fields, convert, row, strict=True)}
                for row in fetched]


_WORD = re.compile(r"[a-z_]*\Z")


def _inline_words(sql: str, slots: list) -> tuple[str, list]:
    """Write the query's fixed words (a status, an empty owner) into its SQL as literals.

    A partial index (``run_pending``: ``WHERE status = 'pending'``) serves only a query whose SQL
    says the same: SQLite matches the terms as written, and a prepared PostgreSQL plan is made
    before any parameter is known. As parameters, the claim's statuses left SQLite reading every
    suspended run through the status index to find the due timers among them. Only lowercase words
    and the empty string are written in (nothing needs quoting); every other value stays a parameter."""
    parts = sql.split("%s")
    if len(parts) != len(slots) + 1 or "%%" in sql:
        return sql, slots
    written, kept = [parts[0]], []
    for (slot, value), part in zip(slots, parts[1:], strict=True):
        if slot is None and isinstance(value, str) and _WORD.match(value):
            written.append(f"'{value}'")
        else:
            written.append("%s")
            kept.append((slot, value))
        written.append(part)
    return "".join(written), kept


def _field(model: type[models.Model], name: str) -> models.Field | None:
    try:
        return model._meta.get_field(name)
    except FieldDoesNotExist:  # an annotation (an aggregate): its value is what the database gave
        return None


def _from_db(field: models.Field | None) -> Callable[[Any], Any]:
    """The Python value of a raw column value, as the ORM would give it."""
    if isinstance(field, models.ForeignKey):  # the key's value is its target's (a parent's UUID)
        return _from_db(field.target_field)
    if isinstance(field, models.UUIDField):
        return lambda v: v if v is None or isinstance(v, uuid.UUID) else uuid.UUID(v)
    if isinstance(field, models.DateTimeField):
        return _datetime
    if isinstance(field, models.BooleanField):
        return lambda v: v if v is None else bool(v)
    if isinstance(field, models.JSONField):
        return lambda v: json.loads(v) if isinstance(v, str) else v
    if isinstance(field, models.DurationField):  # SQLite keeps microseconds, PostgreSQL an interval
        return lambda v: v if v is None or isinstance(v, timedelta) else timedelta(microseconds=v)
    if isinstance(field, models.DecimalField):
        return lambda v: v if v is None else field.to_python(v)
    return lambda v: v


def _datetime(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime) and value.tzinfo is not None:
        return value
    parsed = parse_datetime(value) if isinstance(value, str) else value
    return timezone.make_aware(parsed, UTC) if timezone.is_naive(parsed) else parsed


_GETS: dict[type[models.Model], FrozenQuery] = {}


def get(model: type[models.Model], pk: Any) -> models.Model:
    """``model.objects.get(pk=pk)`` compiled once, for a model keyed by UUID (raises ``DoesNotExist`` the same way)."""
    query = _GETS.get(model)
    if query is None:
        names = [f.attname for f in model._meta.concrete_fields]
        query = _GETS[model] = FrozenQuery(
            model, names, lambda _variant, pk: model._base_manager.filter(pk=pk).values(*names),
            pk=SENTINEL_UUID)
    rows = query.rows(pk=pk)
    if not rows:
        raise model.DoesNotExist(f"{model.__name__} matching query does not exist.")
    return model.from_db(connection.alias, query.fields, list(rows[0].values()))


# -- writes -----------------------------------------------------------------------------------

_SQL: dict[tuple, Any] = {}  # compiled statements (and their fields) by shape
_LOCK = threading.Lock()


def _columns(model: type[models.Model], names: Iterable[str]) -> list[models.Field]:
    return [model._meta.get_field(name) for name in names]


# Fields whose preparation returns a value of this exact type unchanged (``get_db_prep_save`` of a
# CharField given a str is that str, of an IntegerField given an int that int, on every backend):
# preparing 40 columns of a run through Django's field methods cost more than the INSERT itself.
# Anything else (dates, JSON, UUIDs, decimals, a value of another type) goes through its field.
_PLAIN_TYPES: dict[type[models.Field], type] = {
    models.CharField: str, models.TextField: str, models.BooleanField: bool, models.FloatField: float,
    models.IntegerField: int, models.PositiveIntegerField: int, models.PositiveSmallIntegerField: int,
    models.SmallIntegerField: int, models.BigIntegerField: int, models.PositiveBigIntegerField: int,
}


# Fields whose preparation of None is None on every backend (a JSONField's is not: JSON null).
_NONE_IS_NULL = (models.DateTimeField, models.UUIDField, models.DecimalField, models.DurationField,
                 models.ForeignKey, models.BigAutoField, models.AutoField)


def _prepared_for_save(field: models.Field, value: Any, conn: Any) -> Any:
    """``field.get_db_prep_save(value, conn)``, without the calls for a plain value (``_PLAIN_TYPES``),
    a UTC time (``utc_time``), a UUID, a foreign key's value, or a None that is NULL. A run's row
    has 40 columns, most of them empty at its start: Django's per-field calls cost more than its INSERT."""
    field_type = type(field)
    kind = _PLAIN_TYPES.get(field_type)
    if kind is not None and (value is None or type(value) is kind):
        return value
    if value is None and field_type in _NONE_IS_NULL:
        return None
    if type(value) is datetime and field_type is models.DateTimeField and value.tzinfo is UTC:
        return utc_time(value, conn)
    if type(value) is uuid.UUID and field_type is models.UUIDField:
        return value if conn.features.has_native_uuid_field else value.hex
    if field_type is models.ForeignKey:
        return _prepared_for_save(field.target_field, value, conn)
    return field.get_db_prep_save(value, conn)


def _prepared_for_lookup(field: models.Field, value: Any, conn: Any) -> Any:
    """``field.get_db_prep_value(value, conn)``, likewise."""
    if value is not None and type(value) is _PLAIN_TYPES.get(type(field)):
        return value
    if type(value) is datetime and type(field) is models.DateTimeField and value.tzinfo is UTC:
        return utc_time(value, conn)
    return field.get_db_prep_value(value, conn)


def utc_time(value: datetime, conn: Any) -> Any:
    """An aware UTC datetime as Django stores it: psycopg takes it as it is; SQLite stores the naive
    UTC text (what ``str()`` of the naive value gives: its ``isoformat(" ")`` less "+00:00", at half
    the cost) when the connection's time zone is UTC. The engine stamps every row with one or
    more of these, and Django's generic path (time-zone checks, a conversion) cost more than the
    write. Any other connection time zone goes through Django's own adaptation."""
    if conn.vendor == "postgresql":
        return value
    if conn.vendor == "sqlite" and conn.timezone is UTC:
        return value.isoformat(" ")[:-6]
    return conn.ops.adapt_datetimefield_value(value)


def update_statement(queryset: models.QuerySet, where: dict[str, Any], values: dict[str, Any]
                     ) -> tuple[str, list] | None:
    """The SQL and parameters of ``queryset.filter(**where).update(**values)``, its SQL cached per shape,
    or None when the ORM must build it: a value that is an expression (``F("tokens") + n``) or a
    lookup other than equality and ``__in``. Each value is prepared by its field as the ORM would."""
    model = queryset.model
    if any(isinstance(v, Combinable) for v in values.values()) or any(
            "__" in key and not key.endswith("__in") for key in where):
        return None
    shape = ("update", connection.vendor, model, tuple(values),
             tuple((key, len(v) if key.endswith("__in") else None) for key, v in where.items()))
    cached = _SQL.get(shape)
    if cached is None:
        set_fields = _columns(model, values)
        where_fields = _columns(model, (key.removesuffix("__in") for key in where))
        qn = connection.ops.quote_name
        sets = ", ".join(f"{qn(f.column)} = %s" for f in set_fields)
        conds = " AND ".join(
            f"{qn(f.column)} IN ({', '.join(['%s'] * len(v))})" if key.endswith("__in") else f"{qn(f.column)} = %s"
            for f, (key, v) in zip(where_fields, where.items(), strict=True))
        sql = f"UPDATE {qn(model._meta.db_table)} SET {sets} WHERE {conds}"
        with _LOCK:
            cached = _SQL[shape] = (sql, set_fields, where_fields)  # the fields too: looked up once per shape
    sql, set_fields, where_fields = cached
    conn = connections[DEFAULT_DB_ALIAS]  # the thread's connection itself, not a proxy looked up per use
    params = [_prepared_for_save(f, v, conn) for f, v in zip(set_fields, values.values(), strict=True)]
    for f, (key, v) in zip(where_fields, where.items(), strict=True):
        if key.endswith("__in"):
            params += [_prepared_for_lookup(f, item, conn) for item in v]
        else:
            params.append(_prepared_for_lookup(f, v, conn))
    return sql, params


def update(queryset: models.QuerySet, where: dict[str, Any], values: dict[str, Any]) -> int:
    """``queryset.filter(**where).update(**values)`` with its SQL cached per shape (``update_statement``);
    what that leaves to the ORM goes through the ORM unchanged."""
    statement = update_statement(queryset, where, values)
    if statement is None:
        return queryset.filter(**where).update(**values)
    return prepared.execute(connections[DEFAULT_DB_ALIAS], *statement)  # PostgreSQL: planned once per connection


def _insert_sql(model: type[models.Model], fields: Sequence[models.Field]) -> str:
    qn = connection.ops.quote_name
    return (f"INSERT INTO {qn(model._meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
            f"VALUES ({', '.join(['%s'] * len(fields))})")


def _insert_parts(obj: models.Model) -> tuple[bool, str, list]:
    """(whether the database assigns the key, the cached INSERT without RETURNING, its parameters)."""
    model = type(obj)
    pk = model._meta.pk
    # An auto-incremented key the database assigns is left out, as the ORM leaves it out.
    auto = isinstance(pk, models.AutoField | models.BigAutoField | models.SmallAutoField) and obj.pk is None
    shape = ("insert", connection.vendor, model, auto)
    cached = _SQL.get(shape)
    if cached is None:
        fields = [f for f in model._meta.concrete_fields if not f.generated and not (auto and f is pk)]
        sql = _insert_sql(model, fields)
        with _LOCK:
            # (field, attribute to read) per column; None where pre_save must give the value (auto_now)
            cached = _SQL[shape] = (sql, [(f, None if _sets_itself(f) else f.attname) for f in fields])
    sql, plan = cached
    conn = connections[DEFAULT_DB_ALIAS]
    return auto, sql, [_prepared_for_save(f, f.pre_save(obj, True) if attname is None else getattr(obj, attname), conn)
                       for f, attname in plan]


class Row:
    """A row for ``insert_all`` named by the values that are not its columns' defaults.

    What a model instance would be, without making one: a run's start names 9 of its row's 42
    columns, and building the model and preparing every default through its field took 40% of a
    start's CPU. A column's constant default is prepared once per model (``_template``); a
    callable one (a new id, the time) is called for each row, as the model would call it."""

    __slots__ = ("model", "values")

    def __init__(self, model: type[models.Model], **values: Any):
        self.model = model
        self.values = values  # by attribute name (a foreign key's ``parent_id``)


_CALL, _NOW = object(), object()  # a default called per row; a time ``auto_now`` stamps per row


def _template(model: type[models.Model]) -> tuple[str, list, frozenset]:
    """(the INSERT, per column (field, its prepared constant default, or _CALL / _NOW), the attribute names).
    A database-assigned key is left out, as the ORM leaves it out."""
    shape = ("template", connection.vendor, model)
    cached = _SQL.get(shape)
    if cached is None:
        conn = connections[DEFAULT_DB_ALIAS]
        fields = [f for f in model._meta.concrete_fields if not f.generated
                  and not isinstance(f, models.AutoField | models.BigAutoField | models.SmallAutoField)]
        plan = []
        for f in fields:
            if _sets_itself(f) or getattr(f, "db_default", models.NOT_PROVIDED) is not models.NOT_PROVIDED:
                if type(f) is not models.DateTimeField or not _sets_itself(f):
                    raise TypeError(f"frozen.Row cannot insert {model.__name__}: {f.name} sets itself")
                plan.append((f, _NOW))
            elif f.has_default() and callable(f.default):
                plan.append((f, _CALL))
            else:
                plan.append((f, _prepared_for_save(f, f.get_default(), conn)))
        sql = _insert_sql(model, fields)
        with _LOCK:
            cached = _SQL[shape] = (sql, plan, frozenset(f.attname for f in fields))
    return cached


def _row_parts(row: Row) -> tuple[bool, str, list]:
    sql, plan, names = _template(row.model)
    values = row.values
    if not values.keys() <= names:
        raise TypeError(f"{row.model.__name__} has no column {sorted(values.keys() - names)}")
    conn = connections[DEFAULT_DB_ALIAS]
    params = []
    for field, default in plan:
        if field.attname in values:
            params.append(_prepared_for_save(field, values[field.attname], conn))
        elif default is _CALL:
            params.append(_prepared_for_save(field, field.get_default(), conn))
        elif default is _NOW:
            params.append(_prepared_for_save(field, timezone.now(), conn))
        else:
            params.append(default)
    return False, sql, params


def _sets_itself(field: models.Field) -> bool:
    """Whether ``field.pre_save`` can do more than read the attribute: an overridden one, except a
    date field's without auto_now/auto_now_add (which then reads the attribute, as the base does)."""
    if type(field).pre_save is models.Field.pre_save:
        return False
    if isinstance(field, models.DateField) and type(field).pre_save in (models.DateField.pre_save,
                                                                         models.DateTimeField.pre_save):
        return field.auto_now or field.auto_now_add
    return True


def _inserted(obj: models.Model) -> None:
    obj._state.adding = False
    obj._state.db = connection.alias


def insert_all(objs: Sequence[models.Model | Row], *, bell: tuple[str, str] | None = None) -> None:
    """Insert rows of several models, all or none, keys chosen by the caller (or left to the database
    and not read back).

    On PostgreSQL it is one statement, every INSERT but the last in a data-modifying ``WITH``: a
    statement is atomic on its own, so there is no BEGIN and COMMIT to wait for (two of a run's
    start's four round trips). A foreign key between the rows holds, because the engine's keys are
    checked at the end of the statement or the transaction. Elsewhere it is one transaction.
    Inside a caller's transaction either form simply joins it.

    ``bell`` (PostgreSQL): a ``(channel, payload)`` NOTIFY that the same statement sends, delivered
    when it commits (the doorbell of a run's start, without a round trip of its own)."""
    parts = [_row_parts(obj) if type(obj) is Row else _insert_parts(obj) for obj in objs]
    if connection.vendor != "postgresql":
        with prepared.own_transaction(), prepared.cursor() as cursor:
            for _auto, sql, params in parts:
                cursor.execute(sql, params)
    else:
        shape = ("insert_all", tuple(sql for _a, sql, _p in parts), bell is not None)
        statement = _SQL.get(shape)
        if statement is None:
            heads = [f"_w{i} AS ({sql})" for i, (_a, sql, _p) in enumerate(parts[:-1])]
            last = parts[-1][1]
            if bell is not None:  # evaluated once, for the last INSERT's one returned row
                heads.append("_bell AS (SELECT pg_notify(%s, %s) AS rung)")
                last += " RETURNING (SELECT 1 FROM _bell)"
            statement = f"WITH {', '.join(heads)} {last}" if heads else last
            with _LOCK:
                _SQL[shape] = statement
        values = [value for _a, _s, params in parts[:-1] for value in params]
        # planned once per connection
        prepared.execute(connections[DEFAULT_DB_ALIAS], statement, [*values, *(bell or ()), *parts[-1][2]])
    for obj in objs:
        if type(obj) is not Row:
            _inserted(obj)


def insert(obj: models.Model) -> models.Model:
    """``obj.save(force_insert=True)`` for a model with a client-side primary key, SQL cached per model.

    Each value is prepared by its field as ``save`` prepares it (``pre_save``, then ``get_db_prep_save``).
    Sends no model signals: only for the engine's own rows, which no receiver listens to on save."""
    auto, sql, params = _insert_parts(obj)
    pk = type(obj)._meta.pk
    if auto and connection.features.can_return_columns_from_insert:
        sql += f" RETURNING {connection.ops.quote_name(pk.column)}"
    with prepared.cursor() as cursor:  # PostgreSQL: planned once per connection
        cursor.execute(sql, params)
        if auto:
            returned = sql.endswith(f"RETURNING {connection.ops.quote_name(pk.column)}")
            setattr(obj, pk.attname, cursor.fetchone()[0] if returned else cursor.lastrowid)
    _inserted(obj)
    return obj
