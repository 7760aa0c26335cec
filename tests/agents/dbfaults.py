"""Workflows for the database-fault tests: whose error is an OperationalError?

``own_database`` has a step that talks to "some other database" and gets OperationalError: the
workflow's error (retried, then failing the step). ``body_queries`` raises it from the workflow's own
body. ``swallows`` wraps a step in ``except Exception``: an outage of the engine's write of that step
must not be swallowed by it.
"""

import os
from pathlib import Path

from django.db import OperationalError

import journal


def _log(line: str) -> None:
    path = Path(os.environ.get("DURABLE_TEST_DIR", "/tmp")) / "executions.log"
    with open(path, "a") as fh:
        fh.write(line + "\n")


@journal.step(retries=1, retry_delay=0.01)
def query_warehouse(table: str) -> int:
    _log(f"warehouse {table}")
    raise OperationalError("could not connect to the warehouse: Connection refused")


@journal.step()
def plain(i: int) -> int:
    _log(f"plain {i}")
    return i


@journal.workflow(name="own_database")
def own_database(ctx) -> int:
    return plain(1) + query_warehouse("orders")


@journal.workflow(name="body_queries")
def body_queries(ctx) -> int:
    plain(1)
    raise OperationalError("the workflow's own connection failed")


@journal.workflow(name="swallows")
def swallows(ctx) -> str:
    try:
        plain(1)
    except Exception:  # what careless workflow code does; an engine outage must pass through it
        return "swallowed"
    return "recorded"
