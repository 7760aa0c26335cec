"""journal.state_at: the run at any step, with its diff against the step before."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import journal
from journal.models import RunStatus
from tests.agents import timetravel  # noqa: F401  (registers the tt-* agents)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def test_dir(tmp_path, monkeypatch, settings):
    monkeypatch.setenv("DURABLE_TEST_DIR", str(tmp_path))
    settings.DURABLE_SANDBOX_ROOT = str(tmp_path / "sandboxes")
    return tmp_path


@pytest.fixture
def files_run(drive):
    run_id = journal.start("tt-files")  # write (1), add (2), write (3), verdict (4), write (5), list (6)
    drive()
    assert journal.get_run(run_id).status == RunStatus.COMPLETED
    return run_id


def test_state_at_a_step_shows_its_record_results_state_and_files(files_run):
    at = journal.state_at(files_run, 4)
    assert (at.position, at.total) == (4, 6)
    assert at.record["step_name"].endswith(".verdict")
    assert at.record["result"] == {"verdict": "approve"} and at.record["error"] is None
    assert at.record["args"] == {"args": [3], "kwargs": {}}
    assert at.record["duration_ms"] is not None
    assert at.results[2] == 3 and at.results[4] == {"verdict": "approve"}
    assert list(at.results) == [1, 2, 3, 4] and 5 not in at.results
    assert at.state == {"total": 3}
    assert sorted(at.files) == ["notes.txt", "sum.txt"]
    assert at.diff["results"] == {"added": {4: {"verdict": "approve"}}}
    assert at.diff["state"] == {"added": {"total": 3}, "removed": [], "changed": {}}
    assert at.span is not None and at.span["name"].endswith(".verdict")


def test_the_diff_shows_files_added_and_unchanged(files_run):
    assert journal.state_at(files_run, 1).diff["files"] == {"added": ["notes.txt"], "removed": [], "modified": []}
    assert journal.state_at(files_run, 2).diff["files"] == {"added": [], "removed": [], "modified": []}
    assert journal.state_at(files_run, 3).diff["files"]["added"] == ["sum.txt"]
    last = journal.state_at(files_run, 6)
    assert sorted(last.files) == ["approve.txt", "notes.txt", "sum.txt"]
    assert last.record["result"] == ["approve.txt", "notes.txt", "sum.txt"]


def test_state_at_takes_a_fixed_number_of_queries(drive, files_run):
    """The stepper calls it on every click: no query may depend on the journal's length."""
    long_run = journal.start("tt-pipeline", 40)
    drive()
    counts = []
    for run_id, position in ((files_run, 3), (long_run, 2), (long_run, 39)):
        with CaptureQueriesContext(connection) as queries:
            journal.state_at(run_id, position)
        counts.append(len(queries))
    assert max(counts) <= 10, counts  # a few indexed lookups, whatever the length


def test_out_of_range_positions_are_refused(files_run, drive):
    for position in (0, 7, -1, "3", None):
        with pytest.raises(journal.BadArgumentsError, match="out of range"):
            journal.state_at(files_run, position)
    empty = journal.start("tt-pipeline", 1)
    with pytest.raises(journal.BadArgumentsError, match="no recorded steps"):
        journal.state_at(empty, 1)
    with pytest.raises(journal.RunNotFoundError):
        journal.state_at("no-such-run", 1)


def test_a_failed_step_shows_its_error(drive, test_dir):
    outage = test_dir / "outage"
    outage.touch()
    run_id = journal.start("tt-flaky", str(outage))
    drive()
    at = journal.state_at(run_id, 2)
    assert at.record["error"]["message"] == "service unavailable" and at.record["result"] is None
    assert at.results[2] == {"error": at.record["error"]}
