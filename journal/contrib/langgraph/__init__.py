"""LangGraph on durable-ui (`pip install durable-ui[langgraph]`).

    from journal.contrib.langgraph import JournalSaver
    graph = builder.compile(checkpointer=JournalSaver())       # threads stored in durable-ui's database

    from journal.contrib.langgraph import graph_workflow, start
    @graph_workflow(name="researcher")                         # the graph as a durable-ui run:
    def researcher(): return builder                           # a dead worker's thread resumes elsewhere
    run_id = start("researcher", {"messages": [...]})

Needs Django set up: the saver stores threads in durable-ui's database.
"""

# history registers the dashboard's thread bridge; retention connects: a purged run takes its thread along
from journal.contrib.langgraph import history, retention  # noqa: F401
from journal.contrib.langgraph.saver import JournalSaver
from journal.contrib.langgraph.workflows import graph_workflow, run_on_thread, start

__all__ = ["JournalSaver", "graph_workflow", "run_on_thread", "start"]
