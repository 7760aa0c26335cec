"""PostgreSQL's one-statement claim (``runstate.claim_statement``) moves a run exactly as the
select-then-update transaction does, from every status a run can be claimed in, and skips a run
another transaction holds."""

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import journal
from journal.driver import leases
from journal.models import Run, RunStatus
from tests.agents import crashy  # noqa: F401 - registers "twelve"

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

HOUR = timedelta(hours=1)


def _setup(kind: str) -> uuid.UUID:
    run_id = uuid.UUID(journal.start("twelve"))
    now = timezone.now()
    long_ago = now - 3 * HOUR
    updates = {
        "pending": {},
        "due timer": {"status": RunStatus.SUSPENDED, "wake_at": now - timedelta(seconds=1),
                      "suspended_at": now - HOUR, "waited": timedelta(minutes=5), "started_at": long_ago},
        "dead worker": {"status": RunStatus.RUNNING, "lease_owner": "dead", "lease_expires_at": now - HOUR,
                        "epoch": 3, "attempts": 2, "started_at": long_ago},
        "compensating": {"status": RunStatus.COMPENSATING, "started_at": long_ago},
        "dead compensator": {"status": RunStatus.COMPENSATING, "lease_owner": "dead", "epoch": 5,
                             "lease_expires_at": now - HOUR, "started_at": long_ago},
    }[kind]
    Run.objects.filter(id=run_id).update(**updates)
    return run_id


def _state(run_id) -> dict:
    run = Run.objects.get(id=run_id)
    return {"status": run.status, "epoch": run.epoch, "attempts": run.attempts, "lease_owner": run.lease_owner,
            "wake_at": run.wake_at, "suspended_at": run.suspended_at, "waited_minutes": round(
                run.waited.total_seconds() / 60), "started_kept": run.started_at < timezone.now() - 2 * HOUR,
            "leased_for": round((run.lease_expires_at - timezone.now()).total_seconds() / 10)}


@pytest.mark.parametrize("kind", ["pending", "due timer", "dead worker", "compensating", "dead compensator"])
def test_the_one_statement_claim_moves_a_run_as_the_transaction_does(kind, monkeypatch):
    fast, slow = _setup(kind), _setup(kind)
    assert leases.claim("w", 1, run_id=uuid.uuid4()) == []  # compiled once (inside an empty transaction)
    with CaptureQueriesContext(connection) as queries:
        [one] = leases.claim("w", 1, run_id=fast)
    assert len(queries.captured_queries) == 1 and queries.captured_queries[0]["sql"].startswith("WITH c AS (")
    monkeypatch.setattr(leases, "_agent_limits", lambda: True)  # the transaction's path, for comparison
    [other] = leases.claim("w", 1, run_id=slow)
    assert _state(fast) == _state(slow)
    assert (one.epoch, one.recovered_from) == (other.epoch, other.recovered_from)
    assert one.recovered_from == ("dead" if kind.startswith("dead") else "")
    expected = RunStatus.COMPENSATING if "compensat" in kind else RunStatus.RUNNING
    assert _state(fast)["status"] == expected and _state(fast)["lease_owner"] == "w"
    if kind == "due timer":
        assert _state(fast)["waited_minutes"] == 65 and _state(fast)["suspended_at"] is None


def test_a_paused_run_or_one_held_by_another_transaction_is_not_claimed():
    paused, held, free = (uuid.UUID(journal.start("twelve")) for _ in range(3))
    Run.objects.filter(id=paused).update(paused=True)
    locked, release, errors = threading.Event(), threading.Event(), []

    def hold():
        try:
            with transaction.atomic():
                list(Run.objects.select_for_update().filter(id=held).values_list("id"))
                locked.set()
                release.wait(10)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        assert leases.claim("w", 1, run_id=paused) == []
        assert leases.claim("w", 1, run_id=held) == []  # skipped, not waited for
        [claim] = leases.claim("w", 1)  # the oldest runnable run nobody holds
        assert claim.run_id == free
    finally:
        release.set()
        holder.join(10)
    assert errors == []
    assert Run.objects.get(id=held).status == RunStatus.PENDING
