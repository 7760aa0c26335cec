"""Deterministic replay: recorded values come back, changed code is reported, never mis-replayed."""

import pytest

import journal
from journal.engine import registry
from journal.models import EventKind, Run, RunStatus, SessionEvent
from tests.agents import replayable

pytestmark = pytest.mark.django_db(transaction=True)


def test_now_random_uuid4_return_their_recorded_values_on_replay(drive):
    run_id = journal.start("nondeterministic_values")
    drive()
    assert journal.get_run(run_id).status == RunStatus.SUSPENDED
    recorded = {
        e.step_name: e.payload["result"]
        for e in SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_COMPLETED)
    }
    journal.signal(run_id, "go")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED
    # The first three values were replayed from the journal after the resume, not drawn again.
    assert run.output["first"] == {"now": recorded["now"], "random": recorded["random"], "uuid": recorded["uuid4"]}
    assert run.output["again"]["uuid"] != run.output["first"]["uuid"]
    positions = list(SessionEvent.objects.steps().filter(run_id=run_id).values_list("position", flat=True))
    assert positions == [1, 2, 3, 4, 5, 6, 7]


def test_a_changed_workflow_is_reported_as_divergent_and_needs_attention(drive):
    run_id = journal.start("evolving")
    drive()
    assert journal.get_run(run_id).status == RunStatus.SUSPENDED
    # Deploy changed code under the same name while the run is in flight.
    defn = registry.get_workflow("evolving")
    workflows, steps = registry.snapshot()
    workflows["evolving"] = registry.WorkflowDef(
        name="evolving", fn=replayable.evolving_changed, version="1", fingerprint=defn.fingerprint,
        module=defn.module)
    registry.restore((workflows, steps))
    journal.signal(run_id, "go")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.NEEDS_ATTENTION
    assert "non-determinism at step 2" in run.attention_reason
    assert "different arguments" in run.attention_reason
    event = SessionEvent.objects.get(run_id=run_id, kind=EventKind.NONDETERMINISM)
    assert event.payload["position"] == 2


def test_unknown_agent_is_refused_and_nothing_is_written():
    with pytest.raises(journal.UnknownAgentError, match="no agent named 'nope'"):
        journal.start("nope")
    assert Run.objects.count() == 0


def test_bad_arguments_are_refused_and_nothing_is_written():
    with pytest.raises(journal.BadArgumentsError, match="bad arguments for agent 'typed'"):
        journal.start("typed", "o-1", 2, 3)
    with pytest.raises(journal.BadArgumentsError):
        journal.start("typed", colour="red")
    assert Run.objects.count() == 0


def test_non_json_arguments_are_refused_at_the_call_site():
    with pytest.raises(journal.SerializationError, match=r"\$.args\[0\] is a set"):
        journal.start("typed", {1, 2})
    assert Run.objects.count() == 0 and SessionEvent.objects.count() == 0


def test_oversized_input_is_refused(settings):
    settings.DURABLE_MAX_PAYLOAD_BYTES = 2048
    with pytest.raises(journal.PayloadTooLargeError, match="limit is 2,048"):
        journal.start("typed", "x" * 5000)
    assert Run.objects.count() == 0


def test_a_non_json_step_result_fails_the_run_with_a_clear_error_and_records_nothing_for_it(drive):
    run_id = journal.start("returns_not_json")
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.FAILED
    assert "the result of step tests.agents.replayable.not_json must be JSON-serialisable: $ is a set" in run.error
    names = list(SessionEvent.objects.steps().filter(run_id=run_id).values_list("step_name", flat=True))
    assert names == ["tests.agents.replayable.echo"]


def test_steps_outside_a_workflow_are_plain_calls():
    assert replayable.echo(5) == 5
    with pytest.raises(journal.DurableError, match="only inside a workflow"):
        journal.current()
