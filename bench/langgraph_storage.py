"""Storage of a growing LangGraph message list: JournalSaver beside LangGraph's own SQLite and
Postgres savers, the same graph, side by side.

    .venv/bin/pip install -e '.[langgraph,langgraph-bench]'
    .venv/bin/python bench/langgraph_storage.py [--messages 200] [--postgres postgres://postgres@127.0.0.1:5432/durable_bench]

One node appends one 1-KiB message (barely compressible content) per super-step, so a thread of
n messages has n checkpoints. Bytes counted two ways: the saver's own columns (logical bytes:
checkpoints, metadata, channel blobs, writes; for JournalSaver also the Blob store's compressed
bytes) and the database's on-disk size of those tables. The Postgres database must exist; the
bench creates LangGraph's tables there and drops them (and durable-ui's, via a fresh
test-style database for JournalSaver) afterwards. Results: bench/results/langgraph_storage.json and .md.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PAYLOAD = 1024


def _content(n: int) -> str:
    return base64.b64encode(random.Random(n).randbytes(PAYLOAD * 3 // 4)).decode()


def grow(checkpointer, messages: int, thread_id: str = "bench") -> int:
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    def talk(state: MessagesState) -> dict:
        n = len(state["messages"])
        return {"messages": [AIMessage(content=_content(n), id=f"m{n}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("talk", talk)
    builder.add_edge(START, "talk")
    builder.add_conditional_edges("talk", lambda s: END if len(s["messages"]) >= messages else "talk")
    graph = builder.compile(checkpointer=checkpointer)
    config = {"configurable": {"thread_id": thread_id}, "recursion_limit": messages + 10}
    graph.invoke({"messages": [HumanMessage(content=_content(0), id="m0")]}, config)
    return len(graph.get_state(config).values["messages"])


def journal_saver(messages: int) -> dict:
    """Run in a child process whose Django database is DATABASE_URL (fresh, migrated here)."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durable_ui.settings")
    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.db.models import Sum

    from journal.contrib.langgraph import JournalSaver
    from journal.models import Blob, LangGraphChannel, LangGraphCheckpoint, LangGraphWrite

    call_command("migrate", verbosity=0)
    assert grow(JournalSaver(), messages) == messages
    rows = sum(len(bytes(c)) + len(bytes(m)) for c, m in LangGraphCheckpoint.objects.values_list("checkpoint",
                                                                                                  "metadata"))
    refs = sum(len(json.dumps(v)) for model in (LangGraphChannel, LangGraphWrite)
               for v in model.objects.values_list("value", flat=True))
    blobs = Blob.objects.aggregate(stored=Sum("stored_size"), raw=Sum("size"))
    tables = ["journal_blob", "journal_langgraphcheckpoint", "journal_langgraphchannel", "journal_langgraphwrite"]
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("SELECT sum(pg_total_relation_size(c)) FROM unnest(%s::regclass[]) c", [tables])
            disk = int(cur.fetchone()[0])
        else:
            placeholders = ", ".join(["%s"] * len(tables))
            cur.execute("SELECT sum(pgsize) FROM dbstat WHERE name IN (SELECT name FROM sqlite_master "
                        f"WHERE tbl_name IN ({placeholders}))", tables)
            disk = int(cur.fetchone()[0])
    return {"checkpoints": LangGraphCheckpoint.objects.count(), "logical": rows + refs + blobs["stored"],
            "logical_uncompressed": rows + refs + blobs["raw"], "disk": disk}


def sqlite_saver(messages: int) -> dict:
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    path = Path(tempfile.mkdtemp(prefix="bench-lg-")) / "langgraph.sqlite3"
    conn = sqlite3.connect(path, check_same_thread=False)
    assert grow(SqliteSaver(conn), messages) == messages
    logical = conn.execute("SELECT (SELECT sum(length(checkpoint) + length(metadata)) FROM checkpoints) + "
                           "(SELECT coalesce(sum(length(value)), 0) FROM writes)").fetchone()[0]
    count = conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
    disk = conn.execute("SELECT sum(pgsize) FROM dbstat WHERE name NOT LIKE 'sqlite_%'").fetchone()[0]
    conn.close()
    return {"checkpoints": count, "logical": logical, "logical_uncompressed": logical, "disk": disk}


def postgres_saver(messages: int, url: str) -> dict:
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg import connect

    tables = ["checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations"]
    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        try:
            assert grow(saver, messages) == messages
            with connect(url) as conn:
                logical = conn.execute(
                    "SELECT (SELECT coalesce(sum(octet_length(checkpoint::text) + octet_length(metadata::text)), 0) "
                    "FROM checkpoints) + (SELECT coalesce(sum(octet_length(blob)), 0) FROM checkpoint_blobs) + "
                    "(SELECT coalesce(sum(octet_length(blob)), 0) FROM checkpoint_writes)").fetchone()[0]
                count = conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
                disk = conn.execute("SELECT sum(pg_total_relation_size(c)) FROM unnest(%s::regclass[]) c",
                                    [tables[:3]]).fetchone()[0]
        finally:
            with connect(url, autocommit=True) as conn:
                for table in tables:
                    conn.execute(f"DROP TABLE IF EXISTS {table}")
    return {"checkpoints": count, "logical": int(logical), "logical_uncompressed": int(logical), "disk": int(disk)}


def _child(messages: int, database_url: str) -> dict:
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, __file__, "--messages", str(messages), "--journal-only"], env=env,
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fresh_postgres(url: str, name: str) -> str:
    from psycopg import connect

    with connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + "/" + name


def _drop_postgres(url: str, name: str) -> None:
    from psycopg import connect

    with connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--postgres", default=os.environ.get("BENCH_POSTGRES_URL",
                                                             "postgres://postgres@127.0.0.1:5432/durable_bench"))
    parser.add_argument("--journal-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.journal_only:
        print(json.dumps(journal_saver(args.messages)))
        return
    n = args.messages
    payload = n * PAYLOAD
    sqlite_db = Path(tempfile.mkdtemp(prefix="bench-lg-")) / "journal.sqlite3"
    scratch = "durable_bench_journalsaver"
    pg_journal = _fresh_postgres(args.postgres, scratch)
    try:
        results = {
            "JournalSaver, SQLite": _child(n, f"sqlite:///{sqlite_db}"),
            "JournalSaver, PostgreSQL": _child(n, pg_journal),
            "SqliteSaver (langgraph-checkpoint-sqlite)": sqlite_saver(n),
            "PostgresSaver (langgraph-checkpoint-postgres)": postgres_saver(n, args.postgres),
        }
    finally:
        _drop_postgres(args.postgres, scratch)
    lines = [f"{n} messages of {PAYLOAD} B ({payload:,} B of content), one checkpoint per message:", "",
             "| saver | checkpoints | logical bytes | per payload byte | on disk | per payload byte |",
             "|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['checkpoints']} | {r['logical']:,} | {r['logical'] / payload:.1f} | "
                     f"{r['disk']:,} | {r['disk'] / payload:.1f} |")
    table = "\n".join(lines)
    print(table)
    out = ROOT / "bench" / "results"
    (out / "langgraph_storage.json").write_text(json.dumps({"messages": n, "payload": payload, **results}, indent=2))
    (out / "langgraph_storage.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
