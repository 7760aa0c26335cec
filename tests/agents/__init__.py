"""Agents used by the tests; worker subprocesses load them through DURABLE_AGENT_MODULES."""
