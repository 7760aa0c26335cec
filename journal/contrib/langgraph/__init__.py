"""LangGraph on durable-ui (`pip install durable-ui[langgraph]`).

    from journal.contrib.langgraph import JournalSaver
    graph = builder.compile(checkpointer=JournalSaver())

Needs Django set up: the saver stores threads in durable-ui's database.
"""

from journal.contrib.langgraph.saver import JournalSaver

__all__ = ["JournalSaver"]
