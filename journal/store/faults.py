"""Named fault-injection points at the engine's commit boundaries.

``DURABLE_FAULTS="after_commit:position=8"`` makes the process SIGKILL itself right after the
commit that recorded step 8: a real crash at a precise instruction, for crash tests. Several
rules are comma-separated; ``point`` alone matches every occurrence. Costs one dict lookup
when unset.
"""

import os
import signal

_rules: list[tuple[str, dict[str, str]]] | None = None


def _load() -> list[tuple[str, dict[str, str]]]:
    rules = []
    for rule in filter(None, (r.strip() for r in os.environ.get("DURABLE_FAULTS", "").split(","))):
        point, _, conditions = rule.partition(":")
        conds = dict(c.split("=", 1) for c in conditions.split(";") if "=" in c)
        rules.append((point, conds))
    return rules


def inject(point: str, **info) -> None:
    global _rules
    if _rules is None:
        _rules = _load()
    if not _rules:
        return
    for name, conds in _rules:
        if name == point and all(str(info.get(k)) == v for k, v in conds.items()):
            os.kill(os.getpid(), signal.SIGKILL)


def reload() -> None:
    global _rules
    _rules = None
