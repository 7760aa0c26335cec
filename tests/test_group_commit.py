"""Group commit: writers that arrive while a commit is in flight share the next one, each behind its own
fence, and each hears only its own answer."""

import threading

import pytest
from django.db import connections
from django.utils import timezone

import journal
from journal.driver import leases
from journal.models import EventKind, Run, RunStatus, SessionEvent
from journal.store import groupcommit, writer
from journal.store.errors import LeaseLost
from journal.store.writer import JournalWriter
from tests.agents import crashy  # noqa: F401 - registers the workflows these tests start
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _claimed_runs(n: int) -> list:
    ids = [journal.start("twelve") for _ in range(n)]
    claims = [leases.claim("w", 1, run_id=rid)[0] for rid in ids]
    return claims


def _held_queue():
    """A queue whose first commit waits for ``release``: whoever arrives meanwhile queues behind it."""
    release, started = threading.Event(), threading.Event()

    def first_alone(item):
        if item[0] == "hold":
            started.set()
            release.wait(10)
            return
        writer._write_one(item)

    return groupcommit.GroupCommit(first_alone, writer._write_many), release, started


def _in_thread(fn, errors: dict, key):
    def target():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - the test inspects what each writer heard
            errors[key] = exc
        finally:
            connections.close_all()
    t = threading.Thread(target=target)
    t.start()
    return t


def test_writers_queued_behind_a_commit_share_the_next_one_and_each_row_is_durable():
    claims = _claimed_runs(4)
    queue, release, started = _held_queue()
    errors: dict = {}
    holder = _in_thread(lambda: queue.submit(("hold", None, None)), errors, "hold")
    started.wait(10)
    writers = [JournalWriter(c.run_id, c.epoch, next_seq=3) for c in claims]
    entries = {}
    threads = []
    for w in writers:
        entry = writer.Entry(3, EventKind.LOG, None, "", '{"message":"shared"}', "test", timezone.now())
        entries[w.run_id] = entry
        threads.append(_in_thread(lambda w=w, e=entry: queue.submit((w, [e], [])), errors, w.run_id))
    wait_for(lambda: len(queue._queue) == 4, timeout=10, message="four writers queued")
    release.set()
    for t in [holder, *threads]:
        t.join(10)
    assert errors == {}
    assert queue.commits == 2 and queue.shared == 4  # the held commit, then one for all four
    for c in claims:
        assert SessionEvent.objects.filter(run_id=c.run_id, seq=3, payload__message="shared").exists()


def test_a_stale_writer_in_a_shared_commit_hears_lease_lost_and_the_others_commit():
    claims = _claimed_runs(3)
    stale_claim = claims[1]
    Run.objects.filter(id=stale_claim.run_id).update(epoch=stale_claim.epoch + 1)  # another worker took it
    queue, release, started = _held_queue()
    errors: dict = {}
    holder = _in_thread(lambda: queue.submit(("hold", None, None)), errors, "hold")
    started.wait(10)
    threads = []
    for c in claims:
        w = JournalWriter(c.run_id, c.epoch, next_seq=3)
        entry = writer.Entry(3, EventKind.LOG, None, "", '{"message":"maybe"}', "test", timezone.now())
        threads.append(_in_thread(lambda w=w, e=entry: queue.submit((w, [e], [])), errors, c.run_id))
    wait_for(lambda: len(queue._queue) == 3, timeout=10, message="three writers queued")
    release.set()
    for t in [holder, *threads]:
        t.join(10)
    assert set(errors) == {stale_claim.run_id} and isinstance(errors[stale_claim.run_id], LeaseLost)
    written = set(SessionEvent.objects.filter(seq=3, payload__message="maybe").values_list("run_id", flat=True))
    assert written == {claims[0].run_id, claims[2].run_id}


def test_a_bad_row_in_a_shared_commit_fails_only_its_own_writer():
    claims = _claimed_runs(3)
    queue, release, started = _held_queue()
    errors: dict = {}
    holder = _in_thread(lambda: queue.submit(("hold", None, None)), errors, "hold")
    started.wait(10)
    threads = []
    for i, c in enumerate(claims):
        w = JournalWriter(c.run_id, c.epoch, next_seq=3)
        seq = 1 if i == 2 else 3  # seq 1 exists already (run_started): a unique violation, this writer's alone
        entry = writer.Entry(seq, EventKind.LOG, None, "", '{"message":"row"}', "test", timezone.now())
        threads.append(_in_thread(lambda w=w, e=entry: queue.submit((w, [e], [])), errors, c.run_id))
    wait_for(lambda: len(queue._queue) == 3, timeout=10, message="three writers queued")
    release.set()
    for t in [holder, *threads]:
        t.join(10)
    assert set(errors) == {claims[2].run_id}
    written = set(SessionEvent.objects.filter(payload__message="row").values_list("run_id", flat=True))
    assert written == {claims[0].run_id, claims[1].run_id}


def test_eight_runs_driven_at_once_keep_dense_journals_through_the_shared_commits(drive, settings):
    settings.DURABLE_GROUP_COMMIT = True  # PostgreSQL's default is off
    ids = [journal.start("twelve", 6, 0) for _ in range(8)]
    before = writer._group()
    drive(concurrency=8)
    for rid in ids:
        run = Run.objects.get(id=rid)
        assert run.status == RunStatus.COMPLETED, run.error
        seqs = list(SessionEvent.objects.filter(run_id=rid).order_by("seq").values_list("seq", flat=True))
        assert seqs == list(range(1, len(seqs) + 1))
        positions = list(SessionEvent.objects.filter(run_id=rid, kind=EventKind.STEP_COMPLETED)
                         .order_by("seq").values_list("position", flat=True))
        assert positions == list(range(1, 7))
    assert before is writer._group()


def test_with_group_commit_off_every_write_is_its_own(settings):
    settings.DURABLE_GROUP_COMMIT = False
    [claim] = _claimed_runs(1)
    group = writer._group()
    commits = group.commits
    w = JournalWriter(claim.run_id, claim.epoch, next_seq=3)
    w.record(EventKind.LOG, {"message": "alone"})
    assert group.commits == commits
    assert SessionEvent.objects.filter(run_id=claim.run_id, payload__message="alone").exists()


def test_by_default_sqlite_shares_commits_and_postgresql_leaves_it_to_the_server(settings):
    from django.db import connection

    settings.DURABLE_GROUP_COMMIT = None
    assert groupcommit.enabled() is (connection.vendor == "sqlite")
    settings.DURABLE_GROUP_COMMIT = True
    assert groupcommit.enabled() is True
