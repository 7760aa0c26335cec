"""Named fault-injection points at the engine's commit boundaries.

``DURABLE_FAULTS="after_commit:position=8"`` makes the process SIGKILL itself right after the
commit that recorded step 8: a real crash at a precise instruction, for crash tests. Several
rules are comma-separated; ``point`` alone matches every occurrence. Costs one dict lookup
when unset.

Two conditions are actions rather than matches: ``raise=operational`` (or ``interface``, ``data``)
raises that Django database error at the point instead of killing the process, as a database
restart would; ``times=N`` fires the rule at most N times in this process. For example
``db_write:kind=step_completed;raise=operational;times=3`` fails the next three attempts to write a
step's record. Points: ``before_commit``/``after_commit`` (around a journal write), ``db_write`` (at
the start of each attempt of a write, before any statement) and ``db_reply`` (after an attempt
committed: the commit went through but its answer was lost), ``claim``, ``renew``, ``effect_lookup``
(an effect's ledger read), ``effect_started``/``effect_executed``, ``compensation_started``.
"""

import os
import signal

from django.db import DataError, InterfaceError, OperationalError

_ACTIONS = {"raise", "times"}
_ERRORS = {
    "operational": lambda: OperationalError("injected fault: the database system is starting up"),
    "interface": lambda: InterfaceError("injected fault: the connection is closed"),
    "data": lambda: DataError("injected fault: invalid input value"),
}
_rules: list[tuple[str, dict[str, str], dict[str, str]]] | None = None
_fired: dict[int, int] = {}
# Whether any rule is set: the points a step passes four times test it before building their details.
armed = bool(os.environ.get("DURABLE_FAULTS", "").strip())


def _load() -> list[tuple[str, dict[str, str], dict[str, str]]]:
    rules = []
    for rule in filter(None, (r.strip() for r in os.environ.get("DURABLE_FAULTS", "").split(","))):
        point, _, conditions = rule.partition(":")
        conds = dict(c.split("=", 1) for c in conditions.split(";") if "=" in c)
        actions = {k: conds.pop(k) for k in list(conds) if k in _ACTIONS}
        if actions.get("raise", "operational") not in _ERRORS:
            raise ValueError(f"DURABLE_FAULTS: unknown error {actions['raise']!r} (one of {sorted(_ERRORS)})")
        rules.append((point, conds, actions))
    return rules


def inject(point: str, **info) -> None:
    global _rules
    if _rules is None:
        _rules = _load()
    if not _rules:
        return
    for index, (name, conds, actions) in enumerate(_rules):
        if name != point or not all(str(info.get(k)) == v for k, v in conds.items()):
            continue
        if "times" in actions:
            if _fired.get(index, 0) >= int(actions["times"]):
                continue
            _fired[index] = _fired.get(index, 0) + 1
        if "raise" in actions:
            raise _ERRORS[actions["raise"]]()
        os.kill(os.getpid(), signal.SIGKILL)


def fired(point: str | None = None) -> int:
    """How many times rules (of ``point``) fired in this process (tests read it)."""
    return sum(n for i, n in _fired.items() if _rules and (point is None or _rules[i][0] == point))


def reload() -> None:
    global _rules, armed
    _rules = None
    _fired.clear()
    armed = bool(os.environ.get("DURABLE_FAULTS", "").strip())
