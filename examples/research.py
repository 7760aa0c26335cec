"""A research agent: search sources → analyze → synthesize, then publish the report (an effect).

    run_id = journal.start("research", "durable execution for AI agents")

1. *Gather*: the model is given two tools, ``search_sources`` and ``read_source`` (read-only
   steps), and calls them until it has notes; every call is journaled, so a resumed run
   replays the conversation without calling the model or the tools again.
2. *Analyze* and 3. *synthesize*: two more model calls, each with its prompt version.
4. *Publish*: ``publish_report`` is an exactly-once effect keyed by the run's idempotency key;
   its compensation ``retract_report`` withdraws it. With ``fact_check="strict"`` a check after
   publishing fails when the report cites too few sources, the run fails, and compensation
   retracts what was published (the saga the demo shows as *compensated*).

Published reports go to ``DURABLE_EXAMPLES_OUTBOX`` (default ``var/outbox``): one JSON file per
idempotency key, and one line per publish/retract in ``outbox.log`` so duplicates would show.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import journal
from examples.llm import client_for, system_tag
from journal.primitives.tools import agent_loop, tool

CORPUS = [
    {"id": "S1", "title": "Durable execution, explained",
     "text": "Durable execution journals every step of a program so that after a crash it resumes where it "
             "stopped. Replay returns recorded results instead of re-running work."},
    {"id": "S2", "title": "Exactly-once side effects with idempotency keys",
     "text": "An effect is made exactly-once by recording intent, executing under an idempotency key and "
             "committing the result with the journal entry. An interrupted effect is in doubt, never guessed."},
    {"id": "S3", "title": "Checkpointers are not durable execution",
     "text": "Saving a snapshot after each step is not enough: a run must also resume automatically, keep its "
             "side effects exactly-once and wait for people for days without holding a thread."},
    {"id": "S4", "title": "Agents that wait for humans",
     "text": "Approvals suspend an agent without a process; a decision days later resumes it with the approver "
             "recorded. Timers and signals work the same way."},
    {"id": "S5", "title": "Deterministic replay and versioning",
     "text": "Workflow code must make the same calls on replay. A changed call is detected at its position and "
             "reported; patch markers let new code branch safely while old runs finish."},
    {"id": "S6", "title": "Counting tokens and cost per step",
     "text": "When model calls are steps, tokens, latency and cost are fields of the journal. Operators can sum "
             "them per run and compare two models on the same history."},
    {"id": "S7", "title": "Sagas and compensation",
     "text": "A saga undoes completed effects in reverse order when a later step fails: a published report is "
             "retracted, a payment refunded. Compensations are effects too, and run exactly once."},
]


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 3}


@tool(description="Search the research corpus; returns the best matching sources (id, title).")
def search_sources(query: str, limit: int = 3) -> list[dict]:
    wanted = _words(query)
    scored = sorted(CORPUS, key=lambda s: (-len(wanted & _words(s["title"] + " " + s["text"])), s["id"]))
    return [{"id": s["id"], "title": s["title"]} for s in scored[:max(1, min(int(limit), len(CORPUS)))]]


@tool(description="Read one source by id; returns its full text.")
def read_source(source_id: str) -> dict:
    for source in CORPUS:
        if source["id"] == source_id:
            return dict(source)
    raise LookupError(f"no source {source_id!r}; ids look like S1..S{len(CORPUS)}")


def outbox() -> Path:
    from django.conf import settings

    path = Path(os.environ.get("DURABLE_EXAMPLES_OUTBOX") or Path(settings.BASE_DIR) / "var" / "outbox")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _log(line: dict) -> None:
    with open(outbox() / "outbox.log", "a") as fh:
        fh.write(json.dumps(line, sort_keys=True) + "\n")


def _slug(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", key)


def retract_report(*args: Any, idempotency_key: str = "", **kwargs: Any) -> dict:
    """Compensation: mark the published report retracted (idempotent: retracting twice changes nothing).

    Accepts the original effect's result (a dict with ``path``) positionally or as ``result=``.
    """
    result = kwargs.get("result") or next((a for a in args if isinstance(a, dict) and "path" in a), None)
    if result is None:
        raise ValueError("retract_report needs the published report's result (with its path)")
    path = Path(result["path"])
    doc = json.loads(path.read_text()) if path.exists() else {"status": "missing"}
    if doc.get("status") == "retracted":
        return {"path": str(path), "status": "retracted", "again": True}
    doc["status"] = "retracted"
    path.write_text(json.dumps(doc, sort_keys=True))
    _log({"action": "retract", "key": result.get("key", ""), "compensation_key": idempotency_key})
    return {"path": str(path), "status": "retracted"}


@journal.step(effect=True, compensate=retract_report, on_in_doubt="retry")
def publish_report(title: str, body: str, sources: list[str], *, idempotency_key: str) -> dict:
    """Publish under the idempotency key: a retry after a crash finds the file and does not publish twice."""
    path = outbox() / f"report-{_slug(idempotency_key)}.json"
    if path.exists():
        return {"path": str(path), "key": idempotency_key, "status": json.loads(path.read_text())["status"]}
    path.write_text(json.dumps({"title": title, "body": body, "sources": sources, "status": "published"},
                               sort_keys=True))
    _log({"action": "publish", "key": idempotency_key, "title": title})
    return {"path": str(path), "key": idempotency_key, "status": "published"}


@journal.step
def fact_check(report: str, sources: list[str], mode: str = "lenient") -> dict:
    cited = sorted(set(re.findall(r"\[(S\d+)\]", report)))
    needed = 4 if mode == "strict" else 1
    if len(cited) < needed:
        raise ValueError(f"fact check ({mode}) failed: the report cites {len(cited)} source(s) "
                         f"({', '.join(cited) or 'none'}); {needed} are required")
    return {"cited": cited, "read": sources, "mode": mode}


GATHER = ("[research-gather] You are a research assistant. Use search_sources to find material on the topic, "
          "read the two most relevant sources with read_source, then reply with concise notes that cite "
          "sources as [S1], [S2].")
ANALYZE = ("[research-analyze] You are an analyst. From the notes, list the three most important findings as "
           "bullet points, keeping the [S#] citations.")
SYNTHESIZE = ("[research-synthesize] You write short reports. Write a titled markdown report (first line "
              "'# <title>') from the findings, citing sources as [S#].")


@journal.workflow(name="research", version="1", description="Search sources, analyze, synthesize and publish a "
                  "report (compensation retracts it)")
def research(ctx: journal.Context, topic: str, fact_check_mode: str = "lenient", model: str | None = None) -> dict:
    client = client_for(responder)
    params: dict[str, Any] = {"temperature": 0}
    if model:
        params["model"] = model
    ctx.set_progress(0, 4, "stages")
    notes, conversation = agent_loop(ctx, client, [{"role": "system", "content": GATHER},
                                                   {"role": "user", "content": f"Topic: {topic}"}],
                                     [search_sources, read_source], prompt_version="research-gather-v1", **params)
    read = [json.loads(m["content"]).get("result", {}).get("id") for m in conversation
            if m.get("role") == "tool" and m.get("name") == "read_source"]
    read = [r for r in read if r]
    ctx.set_progress(1, 4, "stages")
    analysis = ctx.model(client, [{"role": "system", "content": ANALYZE},
                                  {"role": "user", "content": notes["content"]}],
                         prompt_version="research-analyze-v1", **params)
    ctx.set_progress(2, 4, "stages")
    report = ctx.model(client, [{"role": "system", "content": SYNTHESIZE},
                                {"role": "user", "content": f"Topic: {topic}\n\n{analysis['content']}"}],
                       prompt_version="research-synthesize-v1", **params)["content"]
    title = report.splitlines()[0].lstrip("# ").strip() if report else topic
    ctx.set_progress(3, 4, "stages")
    published = publish_report(title, report, read)
    checked = fact_check(report, read, fact_check_mode)
    ctx.set_progress(4, 4, "stages")
    return {"title": title, "published": published["path"], "sources": read, "cited": checked["cited"],
            "words": len(report.split())}


# -- the offline model ----------------------------------------------------------------------

def _tool_results(messages: list[dict], name: str) -> list[Any]:
    out = []
    for m in messages:
        if m.get("role") == "tool" and m.get("name") == name:
            try:
                out.append(json.loads(m["content"]).get("result"))
            except (ValueError, AttributeError):
                out.append(None)
    return out


def responder(messages: list[dict], tools: list[dict] | None, params: dict) -> dict | str:
    """Imitates a model following the prompts above, deterministically."""
    tag = system_tag(messages)
    user = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
    if tag == "research-gather":
        found = _tool_results(messages, "search_sources")
        if not found:
            return {"tool_calls": [{"id": "call_search", "name": "search_sources",
                                    "arguments": {"query": user.removeprefix("Topic: "), "limit": 3}}]}
        read = [r for r in _tool_results(messages, "read_source") if r]
        candidates = [s["id"] for s in (found[-1] or [])]
        for source_id in candidates[:2]:
            if source_id not in [r["id"] for r in read]:
                return {"tool_calls": [{"id": f"call_read_{source_id}", "name": "read_source",
                                        "arguments": {"source_id": source_id}}]}
        return "Notes:\n" + "\n".join(f"- {r['text'].split('. ')[0]}. [{r['id']}]" for r in read)
    if tag == "research-analyze":
        points = [line.lstrip("- ") for line in user.splitlines() if line.startswith("- ")]
        big = "larger" if "large" in params.get("model", "") else "key"
        return "Findings:\n" + "\n".join(f"- ({big}) {p}" for p in points[:3])
    if tag == "research-synthesize":
        topic = user.splitlines()[0].removeprefix("Topic: ")
        body = [line.lstrip("- ") for line in user.splitlines() if line.startswith("- ")]
        closing = "In short: journal every step, key every effect, and let people decide when it matters."
        if "large" in params.get("model", ""):
            closing = "The larger model adds: measure tokens and cost per step, and compare models on one history."
        return f"# {topic.title()}\n\n" + "\n\n".join(body) + f"\n\n{closing}"
    return f"I can help with research. ({len(messages)} messages)"
