"""What a short run asks of the database, counted at the connection rather than timed.

Timings on these shared machines move by a third from one minute to the next; a count of round
trips and commits does not move at all, so the budget of issue 13 ("one round trip and one commit
per plain step", a run's start, claim, load and settle in a handful of statements) is held here as
exact numbers. On PostgreSQL the count is libpq's own trace of the wire (each ``ReadyForQuery`` ends
one round trip, and says whether a transaction is still open); on SQLite it is sqlite3's trace of
every statement the connection runs. A change that adds a round trip fails here and has to say why.
"""

import tempfile

import psycopg
import pytest
from django.db import connection

import journal
from journal.driver import executor, leases

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 10


@journal.step()
def plus_one(i: int) -> int:
    return i + 1


@journal.workflow(name="round-trips", durability="sync")
def ten_steps(ctx, n: int) -> int:
    return sum(plus_one(i) for i in range(n))


def _one_run(steps: int = STEPS) -> None:
    """A run as a worker slot drives it, in this thread and so on this thread's one connection."""
    run_id = journal.start("round-trips", steps)
    [claim] = leases.claim("round-trips-worker", 1, run_id=run_id)
    assert executor.drive(claim, "round-trips-worker") == "completed"


def _libpq_trace(action) -> list[list[str]]:
    """The protocol messages ``action`` exchanged on this thread's connection, as split trace lines."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile() as out:
        pgconn.trace(out.fileno())
        pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            action()
        finally:
            pgconn.untrace()
        out.seek(0)
        return [line.split("\t") for line in out.read().decode("utf-8", "replace").splitlines()]


def _round_trips(messages: list[list[str]]) -> list[str]:
    """Each round trip's end (the backend's ReadyForQuery), as the transaction status it reports."""
    return [m[-1].strip() for m in messages if m[0] == "B" and m[2] == "ReadyForQuery"]


@pytest.mark.postgres
def test_a_ten_step_run_is_one_round_trip_a_step_and_five_for_the_run_on_postgresql():
    for _ in range(3):  # the hot statements are prepared on this connection once, as a worker's are
        _one_run()
    messages = _libpq_trace(_one_run)
    ready = _round_trips(messages)
    sent = [m[2] for m in messages if m[0] == "F"]
    # The start's harness-and-pause lookup and its INSERT, the claim, the load, one per step, the settle.
    assert len(ready) == STEPS + 5, sent
    # Every round trip ends outside a transaction: each statement committed on its own, no BEGIN
    # and no COMMIT travelled, and nothing was left open between two of them.
    assert set(ready) == {"I"}
    queries = [m[3] for m in messages if m[0] == "F" and m[2] == "Query"]
    assert not [q for q in queries if q.strip('" ').upper().startswith(("BEGIN", "COMMIT"))], queries


def _sqlite_statements(action) -> list[str]:
    """Every statement ``action`` ran on this thread's SQLite connection, as sqlite3 traced them."""
    connection.ensure_connection()
    statements: list[str] = []
    connection.connection.set_trace_callback(statements.append)
    try:
        action()
    finally:
        connection.connection.set_trace_callback(None)
    return statements


def _commits(statements: list[str]) -> tuple[int, int]:
    """Transactions committed (each BEGIN … COMMIT, and each write outside one, which commits by
    itself), and how many of them waited for the disk: those made while the connection's
    ``PRAGMA synchronous`` was FULL (2) or EXTRA (3), as the trace's own PRAGMA statements set it."""
    commits = synced = 0
    in_transaction, syncing = False, True  # the test database's init_command sets FULL
    for sql in statements:
        words = sql.strip().upper().replace(" ", "")
        word = sql.lstrip().split(None, 1)[0].upper()
        if words.startswith("PRAGMASYNCHRONOUS="):
            syncing = words.split("=", 1)[1] in ("2", "3", "FULL", "EXTRA")
        elif word == "BEGIN":
            in_transaction = True
        elif word == "COMMIT" or (not in_transaction and word not in ("SELECT", "PRAGMA")):
            in_transaction = False
            commits, synced = commits + 1, synced + syncing
    assert not in_transaction, statements
    return commits, synced


def test_a_ten_step_run_syncs_once_a_step_and_twice_more_on_sqlite():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's statement trace")
    for _ in range(3):
        _one_run()
    statements = _sqlite_statements(_one_run)
    # The start (its run and first record), the claim's UPDATE, the first step (its record and its
    # name for the search summary), each later step's record alone, and the settle (the move, its
    # record, the spans). Each waits for the disk (an fsync) but the claim's, which the first step's
    # commit syncs (sqlite_backend.synced_later): as many fsyncs as the floor's run makes.
    assert _commits(statements) == (STEPS + 3, STEPS + 2), statements
    assert not [s for s in statements if s.lstrip().upper().startswith(("SAVEPOINT", "RELEASE"))], statements


def test_a_longer_run_costs_exactly_its_extra_steps():
    """What a run costs beyond its steps does not grow with the run: twenty steps, ten more than ten."""
    _one_run()
    if connection.vendor == "postgresql":
        def cost(steps: int) -> int:  # round trips
            return len(_round_trips(_libpq_trace(lambda: _one_run(steps))))
    else:
        def cost(steps: int) -> int:  # commits that sync
            return _commits(_sqlite_statements(lambda: _one_run(steps)))[1]
    assert cost(2 * STEPS) - cost(STEPS) == STEPS
