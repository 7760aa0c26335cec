"""durable-ui beside its peers (DBOS, LangGraph) and the floor, in one run: `make bench-peers`."""
