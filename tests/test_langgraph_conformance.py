"""LangGraph's own conformance suite (langgraph-checkpoint-conformance) against JournalSaver,
through the suite's runner, on whichever database the run uses (make test: SQLite, then PostgreSQL).

And a saver that forgets pending writes fails it: the suite really checks what it claims.
"""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from journal.contrib.langgraph import JournalSaver
from journal.models import LangGraphCheckpoint, LangGraphWrite

# The saver's async methods run in Django's sync thread, not this test's: it must see committed rows.
pytestmark = pytest.mark.django_db(transaction=True)


class ForgetfulSaver(JournalSaver):
    """Accepts pending writes and drops them: a crashed super-step would lose its finished tasks."""

    def put_writes(self, config, writes, task_id, task_path=""):
        return None


def _registered(saver_class, name):
    @checkpointer_test(name=name)
    async def factory():
        yield saver_class()
        # The sync thread's connection would outlive the test (and block dropping the test database).
        await sync_to_async(connections.close_all, thread_sensitive=True)()

    return factory


def _validate(saver_class, name):
    report = asyncio.run(validate(_registered(saver_class, name)))
    report.print_report()
    return report


def test_journal_saver_passes_every_capability_base_and_extended():
    report = _validate(JournalSaver, "JournalSaver")
    results = report.results
    assert set(results) == {c.value for c in ALL_CAPABILITIES}
    not_detected = [name for name, r in results.items() if not r.detected]
    assert not not_detected, f"capabilities not detected: {not_detected}"
    failures = {name: r.failures for name, r in results.items() if not r.passed}
    assert not failures, failures
    assert report.passed_all()
    passed = sum(r.tests_passed for r in results.values())
    assert passed >= 80 and sum(r.tests_failed for r in results.values()) == 0
    print(f"JournalSaver: {len(results)} capabilities, {passed} tests passed")
    assert LangGraphCheckpoint.objects.exists()  # it wrote through the ORM to this test database


def test_a_saver_that_drops_pending_writes_fails_the_suite():
    report = _validate(ForgetfulSaver, "ForgetfulSaver")
    assert report.results["put_writes"].passed is False
    assert report.results["put_writes"].tests_failed >= 5
    assert not report.passed_all_base()
    assert report.results["put"].passed  # only what it breaks fails
    assert not LangGraphWrite.objects.exists()
