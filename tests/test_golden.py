"""Golden journals: recorded histories (``journal.engine.history.History`` as JSON) that must keep
replaying on the current code, through the in-memory replayer, without touching the database.

They are regression tests and the model of a deploy gate (``manage.py replay --history FILE``):
a code change that would mis-replay a recorded run fails here, naming the step. Re-record them
after an intended, incompatible change::

    DURABLE_RECORD_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden.py -k record -p no:randomly
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connection

import journal
from journal.driver.replayer import replay
from journal.engine.history import History
from journal.models import Run
from tests.agents import saga, timetravel, waiting  # noqa: F401  (registers the agents recorded here)

pytestmark = pytest.mark.django_db(transaction=True)

HISTORIES = Path(__file__).resolve().parent / "golden" / "histories"
FILES = sorted(p.name for p in HISTORIES.glob("*.json"))


@contextmanager
def no_database():
    """Any SQL at all inside the block fails the test: replay must not need the database."""
    def refuse(execute, sql, params, many, context):
        raise AssertionError(f"the replay touched the database: {sql[:200]}")

    with connection.execute_wrapper(refuse):
        yield


def test_there_are_golden_journals_for_the_examples_and_each_way_a_run_can_go():
    assert {"contract_review", "code_repair", "research", "fork", "compensated", "approval",
            "fan_out"} <= {name.removesuffix(".json") for name in FILES}


@pytest.mark.parametrize("name", FILES)
def test_a_golden_journal_replays_on_the_current_code_without_the_database(name):
    history = History.from_json((HISTORIES / name).read_text())
    with no_database():
        check = replay(history)
    assert check.ok, check.divergence
    assert check.checked == history.total, (check.checked, history.total, check.outcome)


def test_a_golden_journal_catches_a_change_that_would_mis_replay(monkeypatch):
    history = History.from_json((HISTORIES / "approval.json").read_text())
    # The recorded first call no longer happens: the code now asks a different question first.
    first = history.records[min(history.records)]
    first_name = first["step_name"]
    changed = History.from_json(history.to_json())
    changed.records[min(changed.records)] = {**first, "step_name": first_name + "-renamed"}
    with no_database():
        check = replay(changed)
    assert not check.ok
    assert check.divergence.position == min(history.records)
    assert first_name in check.divergence.got


def test_a_history_round_trips_through_json(drive):
    run_id = journal.start("square-parent", 3)
    drive()
    history = History.load(Run.objects.get(id=run_id))
    again = History.from_json(json.dumps(history.to_json()))
    assert again.to_json() == history.to_json()
    assert again.total == history.total > 0


# -- recording (run by hand; see the module docstring) ----------------------------------------

def _record_contracts(drive, monkeypatch, tmp_path) -> str:
    from journal.operations.approvals import decide, pending_approvals

    monkeypatch.setenv("DURABLE_EXAMPLES_OUTBOX", str(tmp_path))
    run_id = journal.start("contract_review", size=4, high_risk=2)
    drive()
    for _ in range(10):  # each escalated contract waits for a person in turn
        for approval in pending_approvals().filter(run_id=run_id):
            decide(approval.id, approved=True, actor="golden", actor_roles={"admin"})
        drive()
    return run_id


def _record_code_repair(drive, monkeypatch, tmp_path, settings) -> str:
    settings.DURABLE_SANDBOX_ROOT = str(tmp_path / "sandboxes")
    run_id = journal.start("code_repair")
    drive()
    return run_id


def _record_research(drive, monkeypatch, tmp_path) -> str:
    # Offline (the scripted client): the model a run calls comes from its configuration, which
    # must be the same when the golden journal replays.
    monkeypatch.setenv("DURABLE_EXAMPLES_OUTBOX", str(tmp_path / "outbox"))
    run_id = journal.start("research", "durable execution for AI agents")
    drive()
    return run_id


def _record_fork(drive, monkeypatch, tmp_path) -> str:
    parent = journal.start("tt-pipeline", 3)
    drive()
    run_id = journal.fork(parent, at_step=2, override=5, actor="golden")
    drive()
    return run_id


def _record_compensated(drive, monkeypatch, tmp_path) -> str:
    run_id = journal.start("saga-trip", ["flight", "hotel", "car"], fail_at=3)
    drive()
    return run_id


def _record_approval(drive, monkeypatch, tmp_path) -> str:
    from journal.operations.approvals import decide, pending_approvals

    run_id = journal.start("approve-me", "ship it?")
    drive()
    decide(pending_approvals().get(run_id=run_id).id, approved=True, actor="golden", comment="fine")
    drive()
    return run_id


def _record_fan_out(drive, monkeypatch, tmp_path) -> str:
    run_id = journal.start("fan-out", [1, 2, 3, 4, 5], concurrency=2)
    drive()
    return run_id


RECORDERS = {"contract_review": _record_contracts, "code_repair": _record_code_repair, "research": _record_research,
             "fork": _record_fork, "compensated": _record_compensated, "approval": _record_approval,
             "fan_out": _record_fan_out}


@pytest.mark.skipif(os.environ.get("DURABLE_RECORD_GOLDEN") != "1", reason="records tests/golden/histories")
@pytest.mark.parametrize("name", sorted(RECORDERS))
def test_record(name, drive, monkeypatch, tmp_path, settings):
    monkeypatch.delenv("DURABLE_LLM_BASE_URL", raising=False)
    recorder = RECORDERS[name]
    args = (drive, monkeypatch, tmp_path, settings) if name == "code_repair" else (drive, monkeypatch, tmp_path)
    run = Run.objects.get(id=recorder(*args))
    assert run.is_terminal, (name, run.status, run.error)
    HISTORIES.mkdir(parents=True, exist_ok=True)
    (HISTORIES / f"{name}.json").write_text(json.dumps(History.load(run).to_json(), indent=1, sort_keys=True) + "\n")
