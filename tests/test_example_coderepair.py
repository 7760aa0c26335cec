"""The code-repair example end to end: a real sandbox, the tests run, edits, green; selective checkpoints."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

import journal

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def offline(monkeypatch, settings):
    monkeypatch.delenv("DURABLE_LLM_BASE_URL", raising=False)
    # sandboxed commands run as an unprivileged user: the root must be reachable by it (pytest's tmp is 0700)
    root = tempfile.mkdtemp(prefix="agents-sandboxes-")
    os.chmod(root, 0o755)
    settings.DURABLE_SANDBOX_ROOT = root
    yield
    shutil.rmtree(root, ignore_errors=True)


def test_code_repair_runs_tests_edits_and_reruns_until_green(drive):
    from journal.models import Checkpoint, Run, SandboxCommand, SessionEvent

    run_id = journal.start("code_repair")
    drive()
    run = Run.objects.get(id=run_id)
    assert run.status == "completed", run.error
    assert run.output["green"] is True and run.output["iterations"] == 4
    assert [e["find"] for e in run.output["edits"]] == ["return a - b", "(len(values) - 1)", "min(x, low)"]
    assert "ok   clamp" in run.output["output"]

    commands = list(SandboxCommand.objects.filter(run_id=run_id, command__startswith="python3").order_by("id"))
    assert [c.exit_code for c in commands] == [1, 1, 1, 0]
    assert "FAIL add" in commands[0].stdout and "FAIL add" not in commands[1].stdout
    models = SessionEvent.objects.steps().filter(run_id=run_id, step_name__startswith="model:").count()
    assert models == 3
    # selective checkpoints: after each file write (2 to set up + 3 edits), never after a test run or a read
    steps = dict(SessionEvent.objects.steps().filter(run_id=run_id).values_list("position", "step_name"))
    taken = set(Checkpoint.objects.filter(run_id=run_id, decision="taken").values_list("position", flat=True))
    writes = {p for p, name in steps.items() if name == "sandbox.write_file"}
    assert len(writes) == 5 and writes <= taken
    assert not taken & {p for p, name in steps.items() if name in ("sandbox.run", "sandbox.read_file")}
