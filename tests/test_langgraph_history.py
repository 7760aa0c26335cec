"""A run's LangGraph thread in the stepper: its checkpoints in order, one at a time with the writes that
made it and the diff against the one before, and "fork from here with edited state" (update_state on a
past checkpoint, on a copy of the thread)."""

import pytest
from django.urls import reverse

import journal
from journal.contrib.langgraph import start
from journal.models import (
    EventKind,
    LangGraphChannel,
    LangGraphCheckpoint,
    LangGraphWrite,
    Run,
    RunStatus,
    SessionEvent,
)
from runs.models import AuditEntry
from tests.agents import langgraph_fork, timetravel  # noqa: F401  (registers the agents)

pytestmark = pytest.mark.django_db(transaction=True)
INPUT = {"total": 1, "log": []}


@pytest.fixture(autouse=True)
def test_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DURABLE_TEST_DIR", str(tmp_path))


@pytest.fixture
def graph_run(drive) -> str:
    run_id = start("lg-fork", INPUT)
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"total": 4, "log": ["add_one->2", "double->4", "finish total=4"]}
    return run_id


def thread_rows(thread_id: str) -> tuple:
    return tuple(list(model.objects.filter(thread_id=thread_id).order_by("id").values())
                 for model in (LangGraphCheckpoint, LangGraphChannel, LangGraphWrite))


def test_the_thread_is_walked_in_order_with_the_writes_and_the_diff(graph_run):
    assert journal.has_thread(graph_run)
    assert journal.thread_total(graph_run) == 5  # the input, START, and one per node
    window = journal.thread_checkpoints(graph_run)
    assert [c["position"] for c in window] == [1, 2, 3, 4, 5]
    assert [c["source"] for c in window] == ["input", "loop", "loop", "loop", "loop"]
    assert [c["step"] for c in window] == [-1, 0, 1, 2, 3]
    assert window[1]["parent_checkpoint_id"] == window[0]["checkpoint_id"]
    assert [c["position"] for c in journal.thread_checkpoints(graph_run, offset=3, limit=1)] == [4]

    at = journal.checkpoint_state(graph_run, position=4)  # after double
    assert at["values"] == {"total": 4, "log": ["add_one->2", "double->4"]}
    assert at["previous_values"] == {"total": 2, "log": ["add_one->2"]}
    assert at["nodes"] == ["double"]
    assert {(w["node"], w["channel"]) for w in at["writes"]} == {("double", "total"), ("double", "log")}
    assert at["next"] == ["finish"]
    assert journal.checkpoint_state(graph_run, checkpoint_id=at["checkpoint_id"])["position"] == 4
    first = journal.checkpoint_state(graph_run, position=1)
    assert first["previous_values"] is None and first["source"] == "input"
    with pytest.raises(journal.BadArgumentsError, match=r"positions 1\.\.5"):
        journal.checkpoint_state(graph_run, position=6)


def test_a_native_run_has_no_thread(drive, settings, tmp_path):
    settings.DURABLE_SANDBOX_ROOT = str(tmp_path / "sandboxes")
    run_id = journal.start("tt-pipeline", 1)
    drive()
    assert not journal.has_thread(run_id)
    with pytest.raises(journal.BadArgumentsError, match="does not drive a LangGraph graph"):
        journal.checkpoint_state(run_id, position=1)


def test_fork_from_a_checkpoint_with_edited_state_continues_the_graph_on_a_copy(graph_run, drive):
    parent_rows = thread_rows(graph_run)
    after_add_one = journal.checkpoint_state(graph_run, position=3)
    assert after_add_one["values"]["total"] == 2 and after_add_one["next"] == ["double"]
    ran_before = len(langgraph_fork.executions())

    child = journal.fork_thread(graph_run, after_add_one["checkpoint_id"],
                                {"total": 10, "log": ["edited"]}, actor="alice", reason="what if 10")
    drive()
    run = journal.get_run(child)
    assert run.status == RunStatus.COMPLETED, run.error
    # The continued graph saw the edited values: a plain channel set, a reducer channel overwritten.
    assert run.output == {"total": 20, "log": ["edited", "double->20", "finish total=20"]}
    assert langgraph_fork.executions()[ran_before:] == ["double", "finish"]  # add_one did not run again
    assert thread_rows(graph_run) == parent_rows  # the parent's thread is untouched
    assert journal.get_run(graph_run).output["total"] == 4
    assert (str(run.forked_from_id), run.created_by) == (graph_run, "alice")
    action = SessionEvent.objects.get(run_id=child, kind=EventKind.OPERATOR_ACTION)
    assert action.actor == "alice" and action.payload["state"] is True
    assert action.payload["thread_checkpoint"] == after_add_one["checkpoint_id"]
    assert action.payload["checkpoint_position"] == 3 and action.payload["edited_channels"] == ["log", "total"]
    # The fork's own thread: the copied ancestors, the edit, then what ran anew.
    assert journal.thread_total(child) == 3 + 1 + 2
    edit = journal.checkpoint_state(child, position=4)
    assert edit["source"] == "update" and edit["values"] == {"total": 10, "log": ["edited"]}
    assert edit["previous_values"] == after_add_one["values"]


def test_an_unchanged_channel_is_left_as_it_was(graph_run, drive):
    at = journal.checkpoint_state(graph_run, position=3)
    child = journal.fork_thread(graph_run, at["checkpoint_id"], {**at["values"], "total": 5}, actor="bob")
    drive()
    assert journal.get_run(child).output == {"total": 10, "log": ["add_one->2", "double->10", "finish total=10"]}


@pytest.mark.parametrize(("values", "message"), [
    ("not a dict", "JSON object"),
    ({"nope": 1}, "no state channel 'nope'"),
    ({"total": float("nan")}, "edited values"),
])
def test_a_bad_thread_fork_is_refused_with_nothing_written(graph_run, values, message):
    at = journal.checkpoint_state(graph_run, position=3)
    counts = (Run.objects.count(), LangGraphCheckpoint.objects.count(), LangGraphChannel.objects.count())
    with pytest.raises(journal.DurableError, match=message):
        journal.fork_thread(graph_run, at["checkpoint_id"], values, actor="alice")
    assert (Run.objects.count(), LangGraphCheckpoint.objects.count(), LangGraphChannel.objects.count()) == counts
    with pytest.raises(journal.BadArgumentsError, match="no checkpoint"):
        journal.fork_thread(graph_run, "no-such-checkpoint", {"total": 1}, actor="alice")
    assert Run.objects.count() == counts[0]


# -- the run's page -------------------------------------------------------------------------------

HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def operator(client, personas):
    client.force_login(personas["operator"])
    return client


def test_the_run_page_shows_the_thread_and_walks_it_one_checkpoint_at_a_time(operator, graph_run):
    page = operator.get(reverse("run_detail", args=[graph_run]))
    assert page.status_code == 200
    body = page.content.decode()
    assert 'aria-label="LangGraph thread"' in body and "checkpoint <span id=\"thread-position\">5</span> of 5" in body
    assert 'id="thread-fork-submit" disabled' in body  # the pre-filled values are sent only when asked
    fragment = operator.get(reverse("run_thread", args=[graph_run]) + "?checkpoint=4", **HX)
    assert fragment.status_code == 200
    text = fragment.content.decode()
    assert 'id="thread-position">4<' in text and 'id="thread-nodes">double<' in text
    assert 'id="thread-diff"' in text and "double-&gt;4" in text
    for bad in ("0", "999", "x", "-3"):  # clamped or the newest: never a 500
        assert operator.get(reverse("run_thread", args=[graph_run]) + f"?checkpoint={bad}").status_code == 200


def test_a_native_run_has_no_thread_card(operator, drive, settings, tmp_path):
    settings.DURABLE_SANDBOX_ROOT = str(tmp_path / "sandboxes")
    run_id = journal.start("tt-pipeline", 1)
    drive()
    assert 'aria-label="LangGraph thread"' not in operator.get(reverse("run_detail", args=[run_id])).content.decode()
    assert operator.get(reverse("run_thread", args=[run_id])).status_code == 404


def test_fork_thread_from_the_page(operator, graph_run, drive):
    at = journal.checkpoint_state(graph_run, position=3)
    url = reverse("run_act", args=[graph_run, "fork_thread"])
    refused = operator.post(url, {"checkpoint_id": at["checkpoint_id"], "values": '{"total": 10}'}, **HX)
    assert "tick" in refused.content.decode() and Run.objects.count() == 1
    resp = operator.post(url, {"checkpoint_id": at["checkpoint_id"], "edit_thread": "on", "reason": "try 10",
                               "values": '{"total": 10, "log": ["add_one->2"]}'}, **HX)
    assert resp.status_code == 200, resp.content
    new_id = resp["HX-Redirect"].strip("/").split("/")[-1]
    drive()
    assert journal.get_run(new_id).output == {"total": 20, "log": ["add_one->2", "double->20", "finish total=20"]}
    entry = AuditEntry.objects.get(action="fork_thread")
    assert entry.ok and entry.comment == "try 10" and entry.actor == "operator"
    bad = operator.post(url, {"checkpoint_id": at["checkpoint_id"], "edit_thread": "on", "values": '{"nope": 1}'},
                        **HX)
    assert "no state channel" in bad.content.decode() and Run.objects.count() == 2


def test_a_checkpoint_whose_values_are_gone_is_reported_in_the_card_not_a_500(operator, graph_run):
    from journal.models import Blob

    Blob.objects.all().delete()
    resp = operator.get(reverse("run_detail", args=[graph_run]))
    assert resp.status_code == 200
    assert 'id="thread-error"' in resp.content.decode()
