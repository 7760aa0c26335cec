"""Graphs that survive their worker: a graph run as a durable-ui run resumes on another worker
from its last checkpoint when its worker process is SIGKILLed, and finished nodes do not run again."""

import random
from collections import Counter
from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone
from langgraph.checkpoint.base import empty_checkpoint

import journal
from journal.contrib.langgraph import JournalSaver, start
from journal.engine import registry
from journal.models import LangGraphChannel, LangGraphCheckpoint, LangGraphWrite, Run, RunStatus, SessionEvent
from journal.operations import retention
from journal.store.errors import LeaseLost
from tests.agents import langgraph_crashy
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
AGENTS = "tests.agents.langgraph_crashy"
NODES = [f"n{i}" for i in range(1, 7)]


def test_a_graph_runs_as_a_run_on_its_own_thread(drive):
    run_id = start(langgraph_crashy.six_nodes, {"done": []})
    drive()
    run = journal.get_run(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"done": NODES}
    assert Counter(langgraph_crashy.executions()) == Counter(NODES)
    state = JournalSaver().get_tuple({"configurable": {"thread_id": run_id, "checkpoint_ns": ""}})
    assert state.checkpoint["channel_values"]["done"] == NODES
    assert LangGraphCheckpoint.objects.filter(thread_id=run_id).count() == 8  # the input, START, and one per node


def test_a_worker_killed_inside_node_4_resumes_on_another_without_rerunning_nodes_1_to_3(
        tmp_path, worker_env, spawn_worker):
    run_id = start("lg-six", {"done": []})
    first = spawn_worker(worker_env(AGENTS, LG_KILL_AT="n4"))
    assert first.wait(timeout=60) == -9, first.log()  # really SIGKILLed, inside node n4
    assert journal.get_run(run_id).status == RunStatus.RUNNING  # the dead worker's lease is still on it
    assert langgraph_crashy.executions(tmp_path) == ["n1", "n2", "n3", "n4"]

    second = spawn_worker(worker_env(AGENTS))
    run = journal.wait(run_id, timeout=90)
    assert second.terminate() == 0, second.log()
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"done": NODES}  # each node's update applied once
    counts = Counter(langgraph_crashy.executions(tmp_path))
    assert counts == {"n1": 1, "n2": 1, "n3": 1, "n4": 2, "n5": 1, "n6": 1}, counts
    assert SessionEvent.objects.filter(run_id=run_id, kind="run_recovered").count() == 1


def test_a_worker_killed_mid_super_step_keeps_the_finished_siblings_pending_write(
        tmp_path, worker_env, spawn_worker):
    """fast and slow run in one super-step; the worker dies in slow after fast's write was saved:
    the next worker runs slow again, not fast (the pending write stands in for it)."""
    run_id = start("lg-pair", {})
    first = spawn_worker(worker_env(AGENTS, LG_KILL_AT="slow"))
    assert first.wait(timeout=60) == -9, first.log()
    second = spawn_worker(worker_env(AGENTS))
    run = journal.wait(run_id, timeout=90)
    assert second.terminate() == 0, second.log()
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output["joined"] == "fast done + slow done"
    counts = Counter(langgraph_crashy.executions(tmp_path))
    assert counts == {"fast": 1, "slow": 2, "join": 1}, counts


@pytest.mark.parametrize("attempt", range(3))
def test_a_worker_killed_at_a_random_moment_reruns_at_most_the_node_in_flight(
        attempt, tmp_path, worker_env, spawn_worker):
    run_id = start("lg-six", {"done": []})
    env = worker_env(AGENTS, LG_NODE_SLEEP="0.15")
    first = spawn_worker(env)
    started = random.randint(1, 5)
    wait_for(lambda: len(langgraph_crashy.executions(tmp_path)) >= started, timeout=60, message="nodes to run")
    first.kill()
    second = spawn_worker(env)
    run = journal.wait(run_id, timeout=90)
    assert second.terminate() == 0, second.log()
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"done": NODES}
    counts = Counter(langgraph_crashy.executions(tmp_path))
    assert set(counts) == set(NODES) and sum(counts.values()) - len(NODES) <= 1, (started, counts)


def test_retention_purging_a_run_deletes_its_thread_and_leaves_other_threads(drive):
    run_id = start("lg-six", {"done": []})
    drive()
    JournalSaver().copy_thread(run_id, "kept-copy")  # a thread that is no run
    assert LangGraphCheckpoint.objects.filter(thread_id=run_id).exists()
    retention.set_rule(keep_days=1)
    assert retention.purge(now=timezone.now() + timedelta(days=2)) == 1
    for model in (LangGraphCheckpoint, LangGraphChannel, LangGraphWrite):
        assert not model.objects.filter(thread_id=run_id).exists()
    copy = JournalSaver().get_tuple({"configurable": {"thread_id": "kept-copy", "checkpoint_ns": ""}})
    assert copy.checkpoint["channel_values"]["done"] == NODES  # its blobs are shared, and still there


def test_a_worker_that_lost_the_run_cannot_write_its_thread():
    """A zombie (paused past its lease while another worker claimed the run) is fenced out: its
    checkpoint and writes are refused, and nothing of them is stored."""
    run_id = start("lg-six", {"done": []})
    epoch = journal.get_run(run_id).epoch
    Run.objects.filter(id=run_id).update(epoch=F("epoch") + 1)  # another worker's claim
    zombie = JournalSaver(fence=(run_id, epoch))
    config = {"configurable": {"thread_id": run_id, "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    with pytest.raises(LeaseLost):
        zombie.put(config, {**checkpoint, "channel_values": {"done": ["n1"]}}, {"source": "loop", "step": 1},
                   {"done": zombie.get_next_version(None, None)})
    with pytest.raises(LeaseLost):
        zombie.put_writes({"configurable": {**config["configurable"], "checkpoint_id": checkpoint["id"]}},
                          [("done", ["n1"])], "task-1")
    graph = langgraph_crashy.six_nodes().compile(checkpointer=zombie)
    with pytest.raises(LeaseLost):  # out of LangGraph's invoke, which the executor handles as "stop, write nothing"
        graph.invoke({"done": []}, {"configurable": {"thread_id": run_id}}, durability="sync")
    assert langgraph_crashy.executions() == []  # refused at the input checkpoint: no node ran
    assert not LangGraphCheckpoint.objects.filter(thread_id=run_id).exists()
    assert not LangGraphWrite.objects.filter(thread_id=run_id).exists()
    holder = JournalSaver(fence=(run_id, epoch + 1))  # the worker that holds it now
    holder.put(config, checkpoint, {"source": "loop", "step": 1}, {})
    assert LangGraphCheckpoint.objects.filter(thread_id=run_id).count() == 1


def test_a_run_can_continue_a_named_thread_and_its_fingerprint_is_the_graphs_code(drive):
    first = start("lg-six", {"done": []}, thread_id="customer-7")
    drive()
    second = start(langgraph_crashy.six_nodes, {"done": ["again"]}, thread_id="customer-7")
    drive()
    assert journal.get_run(first).output == {"done": NODES}
    assert journal.get_run(second).output == {"done": NODES + ["again"] + NODES}  # the same thread, continued
    assert not LangGraphCheckpoint.objects.filter(thread_id__in=[first, second]).exists()
    defn = langgraph_crashy.six_nodes.__durable_workflow__
    assert defn.fingerprint == registry.code_fingerprint(langgraph_crashy.six_nodes)
    assert defn.fingerprint != langgraph_crashy.fast_and_slow.__durable_workflow__.fingerprint
