"""Checkpoint policies, content-addressed storage, state deltas, and restore before replay."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest

import journal
from journal.engine import checkpoints
from journal.engine.restore import restore_sandbox, sandbox_root
from journal.models import Blob, Checkpoint, EventKind, SessionEvent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox_base(settings):
    base = tempfile.mkdtemp(prefix="durable-sbx-test-")
    os.chmod(base, 0o711)
    settings.DURABLE_SANDBOX_ROOT = base
    yield base
    shutil.rmtree(base, ignore_errors=True)


@journal.step()
def think(i: int) -> str:
    return f"thought {i}"


@journal.step(checkpoint=True)
def milestone() -> str:
    return "marked"


@journal.step(checkpoint=False)
def never() -> str:
    return "unmarked"


@journal.workflow(name="cp_mixed")
def cp_mixed(ctx):
    think(1)                                   # 1 nothing changed
    ctx.sandbox.write_file("a.txt", "a")       # 2 files
    ctx.sandbox.run("cat a.txt")               # 3 read-only command
    ctx.set_state({"phase": "edit"})
    think(2)                                   # 4 state
    milestone()                                # 5 marked
    ctx.sandbox.run("echo b > b.txt")          # 6 files
    never()                                    # 7 marked never
    return "done"


def _decisions(run_id) -> dict[int, str]:
    rows = SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_COMPLETED, position__isnull=False)
    return {e.position: e.payload.get("checkpoint", "") for e in rows}


def test_selective_checkpoints_after_changes_and_records_why_it_skipped(drive):
    run_id = journal.start("cp_mixed")
    drive()
    assert journal.wait(run_id, 5).status == "completed"
    taken = list(Checkpoint.objects.filter(run_id=run_id).values_list("position", "reason"))
    assert taken == [(2, "changed sandbox files"), (4, "changed agent state"), (5, "step marked checkpoint=True"),
                     (6, "changed sandbox files")]
    notes = _decisions(run_id)
    assert notes[1] == "skipped: no sandbox or state change"
    assert notes[3] == "skipped: no sandbox or state change"
    assert notes[7] == "skipped: step marked checkpoint=False"
    assert notes[2] == "taken: changed sandbox files"
    shown = checkpoints.step_decisions(run_id)
    assert shown[1]["decision"] == "skipped" and shown[6]["decision"] == "taken" and shown[6]["bytes"] > 0


def test_every_and_manual_policies(drive):
    every = journal.start_run("cp_mixed", checkpoint="every")
    manual = journal.start_run("cp_mixed", checkpoint="manual")
    drive()
    assert list(Checkpoint.objects.filter(run_id=every).values_list("position", flat=True)) == [1, 2, 3, 4, 5, 6]
    assert list(Checkpoint.objects.filter(run_id=manual).values_list("position", flat=True)) == [5]
    assert _decisions(manual)[6] == "skipped: policy manual: step not marked"
    # The manual checkpoint at 5 holds every file changed since the run began.
    assert checkpoints.files_at(manual, 5) == {"a.txt": b"a"}


@journal.workflow(name="cp_big")
def cp_big(ctx, seed: int):
    ctx.sandbox.run(f"python3 -c \"import random; r = random.Random({seed}); "
                    "[open(f'f{i:02}.bin', 'wb').write(r.randbytes(8192)) for i in range(40)]\"")
    ctx.sandbox.run("echo changed > f07.bin")
    ctx.sandbox.run("cp f01.bin copy.bin")
    return "ok"


def test_files_are_stored_once_and_checkpoint_bytes_grow_with_what_changed(drive):
    first = journal.start("cp_big", 1)
    drive()
    assert journal.wait(first, 5).status == "completed"
    cps = list(Checkpoint.objects.filter(run_id=first).order_by("position"))
    assert [c.files_changed for c in cps] == [40, 1, 1]
    assert cps[0].bytes_written > 40 * 8192  # random bytes do not compress
    manifest_bytes = len(str(cps[1].manifest))
    assert cps[1].bytes_written < 200 + manifest_bytes  # one small file, not the 320 KiB workspace
    assert cps[2].bytes_written <= manifest_bytes + 10  # a copy: same content, no new blob
    blobs_after_first = Blob.objects.count()
    second = journal.start("cp_big", 1)  # the same files in another run: deduplicated
    drive()
    assert journal.wait(second, 5).status == "completed"
    assert Blob.objects.count() == blobs_after_first
    assert checkpoints.files_at(second, 3) == checkpoints.files_at(first, 3)


@journal.workflow(name="cp_resume")
def cp_resume(ctx):
    ctx.sandbox.write_file("src/app.py", "print('v1')\n")
    ctx.sandbox.run("echo one >> log.txt && ln -s src/app.py link.py")
    ctx.set_state({"seen": ["one"]})
    think(1)
    ctx.wait_for_signal("go", timeout=timedelta(minutes=5))
    after = ctx.sandbox.run("find . | LC_ALL=C sort; cat log.txt; readlink link.py")
    return after.stdout


def test_resume_restores_the_sandbox_to_the_latest_checkpoint(drive):
    run_id = journal.start("cp_resume")
    drive()
    root = sandbox_root(run_id)
    clean = journal.start("cp_resume")
    drive()
    # Tamper as a half-finished command (or another machine's empty disk) would.
    (root / "log.txt").write_text("one\ntwo (a re-run append)\n")
    (root / "junk.tmp").write_text("left behind")
    (root / "src" / "app.py").unlink()
    os.makedirs(root / "build" / "out")
    journal.signal(run_id, "go")
    shutil.rmtree(sandbox_root(clean))  # a fresh disk
    journal.signal(clean, "go")
    drive()
    expected = ".\n./link.py\n./log.txt\n./src\n./src/app.py\none\nsrc/app.py\n"
    assert journal.wait(run_id, 5).output == expected
    assert journal.wait(clean, 5).output == expected
    assert checkpoints.manifest_at(run_id, 1) == {"src/app.py": checkpoints.manifest_at(run_id, 2)["src/app.py"]}
    assert checkpoints.manifest_at(run_id, 2)["link.py"] == "->src/app.py"
    assert checkpoints.files_at(run_id, 2) == {"src/app.py": b"print('v1')\n", "log.txt": b"one\n"}
    assert checkpoints.state_at_checkpoint(run_id, 2) is None  # state set after step 2 is saved at 3
    assert checkpoints.state_at_checkpoint(run_id, 3) == {"seen": ["one"]}
    assert checkpoints.manifest_at(run_id, 0) == {}


@journal.workflow(name="cp_transcript")
def cp_transcript(ctx, n: int):
    messages = []
    for i in range(n):
        messages.append(think(i) + " " + "x" * 1000)
        ctx.set_state({"messages": messages, "turn": i})
    return len(messages)


def test_a_growing_conversation_in_agent_state_is_stored_as_deltas(drive):
    run_id = journal.start("cp_transcript", 60)
    drive()
    assert journal.wait(run_id, 10).output == 60
    stored = sum(Checkpoint.objects.filter(run_id=run_id).values_list("bytes_written", flat=True))
    payload = 60 * 1010
    assert stored < 4 * payload  # O(n); whole copies each step would be ~30x the payload
    assert checkpoints.state_at_checkpoint(run_id, 1) is None
    for position in (2, 8, 34, 60):  # the state set after step p-1 is saved with step p
        state = checkpoints.state_at_checkpoint(run_id, position)
        assert state["turn"] == position - 2 and len(state["messages"]) == position - 1
        assert state["messages"][-1].startswith(f"thought {position - 2} ")


def _reply_text(i: int) -> str:
    return f"reply {i} " + "y" * 1000


@journal.step()
def reply(i: int) -> str:
    """Stands in for a model call: the conversation keeps what it returned."""
    return _reply_text(i)


@journal.workflow(name="cp_replies")
def cp_replies(ctx, n: int, pause_at: int = -1):
    messages = []
    for i in range(n):
        if i == pause_at:
            ctx.wait_for_signal("go", timeout=timedelta(minutes=5))
        messages.append(reply(i))
        ctx.set_state({"messages": messages, "last": messages[-1], "turn": i})
    return len(messages)


def _expected(turns: int) -> dict:
    messages = [_reply_text(i) for i in range(turns)]
    return {"messages": messages, "last": messages[-1], "turn": turns - 1}


def _stored_state_bytes(run_id) -> int:
    return sum(len(json.dumps(s)) for s in Checkpoint.objects.filter(run_id=run_id).values_list("state", flat=True))


def test_a_state_of_step_results_refers_to_their_records_and_reads_back_whole(drive):
    run_id = journal.start("cp_replies", 60)
    drive()
    assert journal.wait(run_id, 10).output == 60
    # Each reply is in its step's record once; the checkpoints hold references to those records.
    assert _stored_state_bytes(run_id) < 0.3 * 60 * 1010  # copies: more than twice the payload
    for position in (2, 3, 8, 34, 60):  # the state set after step p-1 is saved with step p
        assert checkpoints.state_at_checkpoint(run_id, position) == _expected(position - 1)


def test_a_resumed_and_a_forked_conversation_read_their_referred_state_back(drive):
    run_id = journal.start("cp_replies", 30, 12)
    drive()
    assert journal.get_run(run_id).status == "suspended"
    journal.signal(run_id, "go")
    drive()  # the resume reads the state back from references, and goes on from it
    assert journal.wait(run_id, 10).output == 30
    assert _stored_state_bytes(run_id) < 0.3 * 30 * 1010  # its first whole copy refers to the replies before
    last = SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_COMPLETED).order_by("-position")[0]
    assert checkpoints.state_at_checkpoint(run_id, last.position) == _expected(29)  # the last set_state: no step after
    fork_id = journal.fork(run_id, at_step=6)  # the fork's copied checkpoints refer to its copied records
    assert checkpoints.state_at_checkpoint(fork_id, 5) == _expected(4)
    drive()
    journal.signal(fork_id, "go")
    drive()
    assert journal.wait(fork_id, 10).output == 30
    assert checkpoints.state_at_checkpoint(fork_id, last.position) == _expected(29)


@journal.workflow(name="cp_ref_lookalike")
def cp_ref_lookalike(ctx):
    items = [{"__result__": 1}]
    for i in range(3):
        items.append(reply(i))
        ctx.set_state({"items": items})
    return len(items)


def test_a_state_that_holds_a_dict_shaped_like_a_reference_is_stored_as_it_is(drive):
    run_id = journal.start("cp_ref_lookalike")
    drive()
    assert journal.wait(run_id, 10).output == 4
    assert checkpoints.state_at_checkpoint(run_id, 3) == {"items": [{"__result__": 1}, _reply_text(0), _reply_text(1)]}


def test_restore_sandbox_materialises_a_manifest_and_refuses_escapes(drive):
    src = journal.start("cp_resume")
    drive()
    manifest = checkpoints.manifest_at(src, 2)
    target = journal.start("cp_mixed")  # any run id: restore creates its directory and Sandbox row
    root = restore_sandbox(target, manifest, position=0, reason="copied for a test")
    assert (root / "src" / "app.py").read_text() == "print('v1')\n" and os.readlink(root / "link.py") == "src/app.py"
    assert checkpoints.manifest_at(target, 0) == manifest
    for bad in ({"../x": manifest["log.txt"]}, {"/etc/x": manifest["log.txt"]}):
        with pytest.raises(ValueError, match="escapes"):
            restore_sandbox(target, bad)
    assert not Path(root.parent / "x").exists()
