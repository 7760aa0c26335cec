"""Erasure on request: after erasing a subject, no table holds its data (blobs decompressed), the runs
still list with their steps and timings, and the record says who erased them and why."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
import zlib

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import DatabaseError, connection, models, transaction
from django.test import Client

import journal
from journal.models import (
    AppendOnlyError,
    Blob,
    Checkpoint,
    Erasure,
    EventKind,
    Run,
    RunStatus,
    SessionEvent,
)
from journal.models.session import allow_erasure
from journal.operations.erasure import subject_digest
from journal.primitives.llm_clients import ScriptedClient
from journal.store import blobs
from runs.models import AuditEntry

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox_root(settings):
    base = tempfile.mkdtemp(prefix="durable-erasure-test-")
    os.chmod(base, 0o711)
    settings.DURABLE_SANDBOX_ROOT = base
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _echo(messages, tools, params):
    """The model answers with what it was told, and calls a tool with it (a trace attribute)."""
    text = messages[-1]["content"]
    return {"content": f"you said: {text[:200]}", "tool_calls": [{"name": "note", "arguments": {"text": text[:200]}}]}


CLIENT = ScriptedClient(_echo, model="scripted-small")


@journal.step()
def remember(note: str) -> dict:
    return {"echo": note}


@journal.step()
def big(note: str) -> str:
    return f"{note} " * 2000  # past INLINE_LIMIT: the result lives in the blob store


_failed_once: set[str] = set()


@journal.step(retries=1, retry_delay=0.01)
def flaky(note: str) -> str:
    if note not in _failed_once:
        _failed_once.add(note)
        raise ValueError(f"could not reach {note}")  # the error message (a trace span's too) holds the data
    return "ok"


@journal.step(effect=True)
def charge(note: str, *, idempotency_key: str) -> dict:
    return {"charged": note, "key": idempotency_key}


@journal.workflow(name="erasure_subject", signals=["more"])
def subject_flow(ctx, subject: str, note: str, shared: str = "shared content\n"):
    ctx.set_subject(subject)
    ctx.set_subject(subject)  # idempotent
    remember(note)
    big(note)
    flaky(note)
    ctx.set_state({"note": note})
    ctx.sandbox.write_file("notes/customer.txt", f"data {note}\n")
    ctx.sandbox.write_file("shared.txt", shared)
    ctx.sandbox.run(f"echo {note} > out.txt; echo {note}")
    charge(note)
    more = ctx.wait_for_signal("more")
    decision = ctx.request_approval(f"approve {note}?", context={"note": note})
    reply = ctx.model(CLIENT, [{"role": "user", "content": f"hello {note} " + "x" * 21_000}])
    ctx.log("noted", note=note)
    return {"note": note, "more": more, "decision": decision["approved"], "reply": reply["content"][:40]}


@journal.workflow(name="erasure_waiting", signals=["go"])
def waiting_flow(ctx, note: str):
    remember(note)
    return ctx.wait_for_signal("go")


def _complete(drive, subject: str, note: str) -> str:
    run_id = journal.start_run("erasure_subject", [subject, note])
    drive()
    journal.signal(run_id, "more", {"note": note}, actor="op")
    drive()
    approval = Run.objects.get(id=run_id).approvals.get()
    journal.decide(approval.id, approved=True, actor="op", comment=f"ok for {note}", edited={"note": note})
    drive()
    run = journal.wait(run_id, timeout=10)
    assert run.status == RunStatus.COMPLETED, run.error
    return run_id


def _project_text() -> list[tuple[str, str]]:
    """(table.column, text) for every text, JSON and binary value of every model of the project, with every
    blob decompressed: what a search for a subject's data must come up empty in."""
    out = []
    for app in ("journal", "runs"):
        for model in apps.get_app_config(app).get_models():
            fields = [f for f in model._meta.concrete_fields
                      if isinstance(f, models.CharField | models.TextField | models.JSONField | models.BinaryField)]
            for row in model.objects.values_list(*[f.attname for f in fields]):
                for field, value in zip(fields, row, strict=True):
                    if value is None:
                        continue
                    if isinstance(value, bytes | memoryview):
                        value = bytes(value)
                        if model is Blob:
                            try:
                                value = zlib.decompress(value)
                            except zlib.error:
                                pass
                        text = value.decode("utf-8", "replace")
                    else:
                        text = value if isinstance(value, str) else json.dumps(value)
                    out.append((f"{model._meta.db_table}.{field.attname}", text))
    return out


def _holding(needle: str) -> set[str]:
    return {where for where, text in _project_text() if needle in text}


def _skeleton(run_id) -> list[tuple]:
    return list(SessionEvent.objects.filter(run_id=run_id).order_by("seq").values_list(
        "seq", "kind", "position", "step_name", "created_at", "actor"))


def _timings(run_id) -> dict:
    return {e.position: (e.payload.get("duration_ms"), e.payload.get("started_at"))
            for e in SessionEvent.objects.steps().filter(run_id=run_id)}


def test_erasing_a_subject_leaves_no_trace_of_its_data_and_keeps_the_skeleton(drive, sandbox_root):
    tag = uuid.uuid4().hex[:10]
    subject, marker = f"customer-{tag}", f"zq-{tag}-marker"
    other_subject, other_marker = f"customer-other-{tag}", f"zq-{tag}-other"
    run_id = _complete(drive, subject, marker)
    other_id = _complete(drive, other_subject, other_marker)
    assert Run.objects.get(id=run_id).subject == subject
    assert SessionEvent.objects.filter(run_id=run_id, kind=EventKind.SUBJECT_SET).count() == 1  # once, not on replay
    before = _holding(marker)
    # the workflow put the marker everywhere the issue names
    for where in ("journal_run.input", "journal_run.output", "journal_sessionevent.payload", "journal_signal.payload",
                  "journal_approval.prompt", "journal_approval.context", "journal_approvaldecision.comment",
                  "journal_sideeffect.args", "journal_sideeffect.result", "journal_checkpoint.state",
                  "journal_sandboxcommand.command", "journal_sandboxcommand.stdout", "journal_tracespan.error",
                  "journal_blob.data"):
        assert where in before, where
    assert _holding(subject)
    skeleton, timings, steps = _skeleton(run_id), _timings(run_id), Run.objects.get(id=run_id).steps
    other_before = {w: t for w, t in _project_text() if other_marker in t}
    shared_digest = blobs.digest_of(b"shared content\n")
    assert Blob.objects.filter(sha256=shared_digest).exists()

    report = journal.erase(subject=subject, actor="dpo@example.com", reason="request #77")

    assert report.run_ids == [run_id] and report.events > 0 and report.blobs_deleted > 0
    assert _holding(marker) == set()  # no table, no blob
    assert _holding(subject) == set()
    assert not os.path.exists(os.path.join(sandbox_root, run_id))  # the files on disk went too
    # the runs still list, with their steps and timings
    run = Run.objects.get(id=run_id)
    assert run.status == RunStatus.COMPLETED and run.steps == steps and run.is_erased
    after = _skeleton(run_id)
    assert after[:-1] == skeleton
    assert after[-1][1] == EventKind.OPERATOR_ACTION and after[-1][5] == "dpo@example.com"
    assert _timings(run_id) == timings
    assert run.input["erased"] is True and run.input["erasure_id"] == report.erasure_id
    # who erased them, and why, without naming the subject
    erasure = Erasure.objects.get(id=report.erasure_id)
    assert (erasure.actor, erasure.reason, erasure.runs) == ("dpo@example.com", "request #77", 1)
    assert erasure.subject_sha256 == subject_digest(subject)
    # another subject's runs are untouched; a blob shared with them is kept and still restores
    assert {w: t for w, t in _project_text() if other_marker in t} == other_before
    assert Blob.objects.filter(sha256=shared_digest).exists()
    assert blobs.get(shared_digest) == b"shared content\n"
    assert Run.objects.get(id=other_id).subject == other_subject
    # the operator's actions on an erased run are refused with a clear error, nothing crashes
    for call in (lambda: journal.replay_check(run_id), lambda: journal.fork(run_id, at_step=1),
                 lambda: journal.retry(run_id)):
        with pytest.raises(journal.RunStateError, match="erased"):
            call()
    # erasing again finds nothing left linked to the subject; the earlier erasure is found by its hash
    preview = journal.preview_erasure(subject=subject)
    assert preview.runs == [] and [e.id for e in preview.already_erased] == [erasure.id]
    again = journal.preview_erasure(run_ids=[run_id])
    assert again.runs[0].erased and not again.to_erase and not again.ok
    with pytest.raises(journal.RunStateError, match="erased before"):
        journal.erase(run_ids=[run_id], actor="dpo", reason="again")
    assert Erasure.objects.count() == 1


def test_running_runs_are_refused_and_nothing_is_written(drive):
    tag = uuid.uuid4().hex[:10]
    subject = f"customer-{tag}"
    done = _complete(drive, subject, f"zq-{tag}")
    waiting = journal.start_run("erasure_waiting", [f"zq-{tag}-w"], subject=subject)
    drive()
    assert Run.objects.get(id=waiting).status == RunStatus.SUSPENDED
    before = _project_text()
    preview = journal.preview_erasure(subject=subject)
    assert [line.run_id for line in preview.refused] == [waiting] and not preview.ok
    with pytest.raises(journal.RunStateError, match="suspended.*Nothing was erased"):
        journal.erase(subject=subject, actor="dpo", reason="request")
    assert _project_text() == before
    assert not Erasure.objects.exists() and not Run.objects.get(id=done).is_erased


def test_a_fork_goes_with_its_run_and_erasing_by_run_id_works(drive):
    tag = uuid.uuid4().hex[:10]
    run_id = _complete(drive, f"customer-{tag}", f"zq-{tag}")
    fork_id = journal.fork(run_id, at_step=2)
    assert Run.objects.get(id=fork_id).subject == f"customer-{tag}"
    drive()
    journal.signal(fork_id, "more", 1)
    drive()
    journal.decide(Run.objects.get(id=fork_id).approvals.get().id, approved=True, actor="op")
    drive()
    assert journal.wait(fork_id, timeout=10).status == RunStatus.COMPLETED
    report = journal.erase(run_ids=[run_id], actor="dpo", reason="request")
    assert sorted(report.run_ids) == sorted([run_id, fork_id])
    assert _holding(f"zq-{tag}") == set()


def test_erasure_rejects_bad_requests_clearly():
    with pytest.raises(journal.BadArgumentsError):
        journal.erase(actor="dpo", reason="r")
    with pytest.raises(journal.BadArgumentsError, match="reason"):
        journal.erase(subject="x", actor="dpo", reason=" ")
    with pytest.raises(journal.RunNotFoundError):
        journal.erase(run_ids=["not-a-uuid"], actor="dpo", reason="r")
    with pytest.raises(journal.RunNotFoundError):
        journal.erase(subject="nobody", actor="dpo", reason="r")


def test_the_orm_lets_erasure_rewrite_payloads_only():
    run_id = journal.start_run("erasure_waiting", ["x"])
    event = SessionEvent.objects.get(run_id=run_id, seq=1)
    with pytest.raises(AppendOnlyError):
        SessionEvent.objects.filter(id=event.id).update(payload={})
    with transaction.atomic(), allow_erasure():
        with pytest.raises(AppendOnlyError):
            SessionEvent.objects.filter(id=event.id).update(kind="log")
        SessionEvent.objects.filter(id=event.id).update(payload={"erased": True})
    assert SessionEvent.objects.get(id=event.id).payload == {"erased": True}


@pytest.mark.postgres
def test_postgresql_trigger_passes_erasure_payload_updates_only():
    run_id = journal.start_run("erasure_waiting", ["x"])
    event = SessionEvent.objects.get(run_id=run_id, seq=1)
    payload_sql = "UPDATE journal_sessionevent SET payload = '{\"erased\": true}'::jsonb WHERE id = %s"
    for sql in (payload_sql, "UPDATE journal_sessionevent SET kind = 'log' WHERE id = %s"):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cur:
            cur.execute(sql, [event.id])  # an ordinary UPDATE: refused
    for sql in ("UPDATE journal_sessionevent SET kind = 'log', payload = '{}'::jsonb WHERE id = %s",
                "UPDATE journal_sessionevent SET seq = 99 WHERE id = %s",
                "UPDATE journal_sessionevent SET actor = 'me' WHERE id = %s"):
        with pytest.raises(DatabaseError, match="only the payload"), transaction.atomic(), \
                connection.cursor() as cur:
            cur.execute("SET LOCAL durable.erasure = 'on'")
            cur.execute(sql, [event.id])  # erasure's setting, but another column: refused
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL durable.erasure = 'on'")
        cur.execute(payload_sql, [event.id])
    assert SessionEvent.objects.get(id=event.id).payload == {"erased": True}
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cur:
        cur.execute(payload_sql, [event.id])  # SET LOCAL ended with its transaction


def test_retention_purge_collects_blobs_nothing_refers_to(drive):
    from datetime import timedelta

    from django.utils import timezone

    from journal.models import RetentionRule
    from journal.operations import retention

    tag = uuid.uuid4().hex[:10]
    run_id = _complete(drive, f"customer-{tag}", f"zq-{tag}")
    mine = blobs.digests_referenced(runs=[run_id])
    assert mine
    long_ago = timezone.now() - timedelta(days=40)
    Run.objects.filter(id=run_id).update(finished_at=long_ago)
    Blob.objects.update(created_at=long_ago)
    RetentionRule.objects.create(keep_days=30)
    assert retention.purge() == 1
    assert not Blob.objects.filter(sha256__in=mine).exists()
    assert _holding(f"zq-{tag}") == set()


def test_the_erase_command_previews_then_erases(drive, capsys):
    tag = uuid.uuid4().hex[:10]
    run_id = _complete(drive, f"customer-{tag}", f"zq-{tag}")
    call_command("erase", "--subject", f"customer-{tag}", "--dry-run")
    out = capsys.readouterr().out
    assert run_id in out and "would erase 1 run(s)" in out
    assert not Erasure.objects.exists()
    call_command("erase", "--run", run_id, "--reason", "ticket 9", "--yes", "--actor", "dpo")
    assert "erased 1 run(s)" in capsys.readouterr().out
    assert Run.objects.get(id=run_id).is_erased and Checkpoint.objects.filter(run_id=run_id).exists()


def test_the_erasure_page_previews_erases_and_audits(drive, personas):
    tag = uuid.uuid4().hex[:10]
    subject, marker = f"customer-{tag}", f"zq-{tag}"
    run_id = _complete(drive, subject, marker)
    for role in ("viewer", "operator"):
        client = Client()
        client.force_login(personas[role])
        assert client.get("/settings/erasure/", {"subject": subject}).status_code == 403
        assert client.post("/settings/erasure/erase/", {"subject": subject, "reason": "x"}).status_code == 403
    admin = Client()
    admin.force_login(personas["admin"])
    page = admin.get("/settings/erasure/", {"subject": subject})
    assert page.status_code == 200
    html = page.content.decode()
    assert run_id[:10] in html and "would erase" in html and "erasure-confirm" in html
    done = admin.post("/settings/erasure/erase/", {"subject": subject, "reason": "request #5"})
    assert done.status_code == 302 and "done=" in done["Location"]
    assert "Erased" in admin.get(done["Location"]).content.decode()
    entries = AuditEntry.objects.filter(action="erase")
    assert {e.actor for e in entries} == {"admin"} and entries.filter(run_id=run_id).exists()
    assert _holding(marker) == set() and _holding(subject) == set()
    # the erased run's pages answer, and show the marker
    detail = admin.get(f"/runs/{run_id}/")
    assert detail.status_code == 200 and "erased" in detail.content.decode()
    for seq in SessionEvent.objects.filter(run_id=run_id).values_list("seq", flat=True):
        assert admin.get(f"/runs/{run_id}/events/{seq}/payload/").status_code == 200
    for step in range(1, Run.objects.get(id=run_id).steps + 1):
        assert admin.get(f"/runs/{run_id}/", {"step": step}).status_code == 200


def test_a_graph_runs_thread_is_erased_and_a_thread_sharing_its_blobs_still_loads(drive):
    from datetime import timedelta

    from django.utils import timezone

    from journal.contrib.langgraph import JournalSaver, start
    from journal.models import LangGraphChannel, LangGraphCheckpoint, LangGraphWrite
    from tests.agents import langgraph_crashy

    marker = f"zq-{uuid.uuid4().hex[:10]}"
    erased, kept = start(langgraph_crashy.six_nodes, {"done": [marker]}), start("lg-six", {"done": []})
    drive()
    nodes = [f"n{i}" for i in range(1, 7)]
    assert journal.get_run(erased).status == journal.get_run(kept).status == RunStatus.COMPLETED
    assert _holding(marker)
    journal.erase(run_ids=[erased], actor="dpo", reason="request")
    assert _holding(marker) == set()
    for model in (LangGraphCheckpoint, LangGraphChannel, LangGraphWrite):
        assert not model.objects.filter(thread_id=erased).exists()

    def kept_state():
        return JournalSaver().get_tuple({"configurable": {"thread_id": kept, "checkpoint_ns": ""}})

    assert kept_state().checkpoint["channel_values"]["done"] == nodes  # its element blobs were shared: kept
    Blob.objects.update(created_at=timezone.now() - timedelta(days=1))
    blobs.collect_garbage()  # a full sweep (what retention's purge runs) keeps every live list's chunks
    assert kept_state().checkpoint["channel_values"]["done"] == nodes


def test_the_erasure_page_answers_odd_input_with_a_message_not_a_500(personas):
    admin = Client()
    admin.force_login(personas["admin"])
    for params in ({"subject": "x" * 500}, {"runs": "not-a-run, 12"}, {"runs": str(uuid.uuid4())}, {"done": "zzz"},
                   {"subject": "nobody"}):
        page = admin.get("/settings/erasure/", params)
        assert page.status_code == 200, params
    assert "no run with id" in admin.get("/settings/erasure/", {"runs": "nope"}).content.decode()
    for data in ({"subject": "nobody", "reason": "r"}, {"subject": "nobody"}, {}, {"runs": "nope", "reason": "r"}):
        assert admin.post("/settings/erasure/erase/", data).status_code == 302, data
    assert not Erasure.objects.exists()
