"""Graphs that survive their worker: a graph run as a durable-ui run resumes on another worker
from its last checkpoint when its worker process is SIGKILLed, and finished nodes do not run again."""

from collections import Counter

import pytest

import journal
from journal.contrib.langgraph import JournalSaver, start
from journal.models import LangGraphCheckpoint, RunStatus, SessionEvent
from tests.agents import langgraph_crashy

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
