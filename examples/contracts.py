"""Contract review pipeline: an executor drafts, a critic approves or sends back, people sign off on risk.

    run_id = journal.start("contract_review", size=500)

For each contract of a (deterministically generated) portfolio:

1. the *executor* model drafts a review: a risk score 1-10, flags and a summary, as JSON;
2. the *critic* model answers ``APPROVE`` or ``REVISE: <what to fix>``; a revision goes back to
   the executor with the critique (at most ``max_rounds`` rounds);
3. a contract whose risk reaches ``high_risk`` waits for a person (``ctx.request_approval``: the
   run suspends, holding no thread, and appears in the approvals inbox);
4. ``accept_review`` records the critic-approved result with a checkpoint of the pipeline's
   state (``checkpoint=True``): this is what a crashed run resumes from. Killed at contract 347,
   it replays 1-346 from the journal (no model calls) and continues at 347.

Progress (n of size) is reported with ``ctx.set_progress``; at the end the portfolio report is
written once, as an effect (``write_report``), under the run's idempotency key.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path
from typing import Any

import journal
from examples.llm import client_for, parse_json_object, system_tag

COUNTERPARTIES = ["Acme Logistics", "Borealis Energy", "Cobalt Health", "Delta Foods", "Ember Software",
                  "Fjord Shipping", "Granite Bank", "Helix Biotech", "Iris Media", "Juniper Retail"]
KINDS = ["master services agreement", "supply agreement", "software licence", "NDA", "lease", "distribution deal"]
CLAUSES = {  # clause → risk weight (what a careful reviewer would flag)
    "payment within 30 days": 0,
    "governing law: England and Wales": 0,
    "mutual confidentiality": 0,
    "liability capped at fees paid": 1,
    "automatic renewal unless cancelled 90 days ahead": 2,
    "termination for convenience by the supplier": 2,
    "exclusive dealing for five years": 3,
    "unlimited liability for data breaches": 4,
    "uncapped indemnity for third-party IP claims": 4,
    "unilateral price changes": 3,
}


def portfolio(size: int = 500, seed: int = 7, corrupt: list[int] | tuple[int, ...] = ()) -> list[dict]:
    """``size`` contracts, the same for the same seed. Indices in ``corrupt`` get an unreadable body."""
    rng = random.Random(seed)
    contracts = []
    names = list(CLAUSES)
    for i in range(1, size + 1):
        clauses = rng.sample(names, rng.randint(2, 4))
        contract = {
            "id": f"C-{i:04d}", "counterparty": rng.choice(COUNTERPARTIES), "kind": rng.choice(KINDS),
            "value": rng.randrange(5, 500) * 1000, "clauses": clauses,
        }
        contract["text"] = (f"Contract {contract['id']}: {contract['kind']} with {contract['counterparty']}, "
                            f"value {contract['value']:,} EUR. Clauses: " + "; ".join(clauses) + ".")
        if i in corrupt:
            contract["text"] = "%PDF-1.4 \ufffd\ufffd <binary scan, OCR failed>"  # what a failed text decode leaves
        contracts.append(contract)
    return contracts


@journal.step(checkpoint=True)
def accept_review(review: dict) -> dict:
    """The critic-approved review of one contract: the pipeline's checkpoint for this contract."""
    return review


@journal.step
def read_contract(contract: dict) -> dict:
    """Extract the text to review; a scan that OCR could not read fails here (ready to fix and fork)."""
    if "\ufffd" in contract["text"]:
        raise ValueError(f"contract {contract['id']} is an unreadable scan; re-upload a text version")
    return {"id": contract["id"], "text": contract["text"]}


def _outbox() -> Path:
    from examples.research import outbox

    return outbox()


@journal.step(effect=True, on_in_doubt="needs_attention")
def write_report(summary: dict, *, idempotency_key: str) -> dict:
    """Write the portfolio report once (a file keyed by the idempotency key, one line in outbox.log)."""
    path = _outbox() / f"contracts-{re.sub(r'[^A-Za-z0-9_-]', '_', idempotency_key)}.json"
    path.write_text(json.dumps(summary, sort_keys=True))
    with open(_outbox() / "outbox.log", "a") as fh:
        fh.write(json.dumps({"action": "contract_report", "key": idempotency_key,
                             "contracts": summary["reviewed"]}, sort_keys=True) + "\n")
    return {"path": str(path), "reviewed": summary["reviewed"]}


DRAFT = ('[contract-draft] You review commercial contracts. Reply with JSON only: {"risk": <1-10>, '
         '"flags": [<risky clauses>], "summary": "<one sentence>"}. If a critique is given, fix what it says.')
CRITIC = ("[contract-critic] You check contract reviews. Reply 'APPROVE' if the review flags every risky clause "
          "and its risk score fits, else 'REVISE: <what to fix>'.")


def _draft_messages(text: str, critique: str | None, previous: str | None) -> list[dict]:
    messages = [{"role": "system", "content": DRAFT}, {"role": "user", "content": text}]
    if critique and previous:
        messages += [{"role": "assistant", "content": previous}, {"role": "user", "content": f"Critique: {critique}"}]
    return messages


def _parse_review(contract_id: str, content: str) -> dict:
    data = parse_json_object(content) or {}
    try:
        risk = min(10, max(1, int(data.get("risk", 5))))
    except (TypeError, ValueError):
        risk = 5
    flags = [str(f)[:200] for f in data.get("flags", []) if isinstance(f, str | int | float)][:10]
    return {"contract_id": contract_id, "risk": risk, "flags": flags, "summary": str(data.get("summary", ""))[:500]}


@journal.workflow(name="contract_review", version="1", description="Review a portfolio of contracts: executor "
                  "drafts, critic approves, people sign off on high risk; checkpoint per contract")
def contract_review(ctx: journal.Context, size: int = 500, seed: int = 7, high_risk: int = 10, max_rounds: int = 2,
                    corrupt: list[int] | None = None, model: str | None = None, pace: float = 0.0) -> dict:
    client = client_for(responder, pace=pace)
    params: dict[str, Any] = {"temperature": 0}
    if model:
        params["model"] = model
    contracts = portfolio(size, seed, corrupt or ())
    reviewed, risk_total, escalated, rejected = 0, 0, 0, []
    ctx.set_progress(0, size, "contracts")
    for contract in contracts:
        text = read_contract(contract)["text"]
        critique = previous = None
        for round_no in range(1, max_rounds + 1):
            draft = ctx.model(client, _draft_messages(text, critique, previous), prompt_version="contract-draft-v2",
                              **params)
            verdict = ctx.model(client, [{"role": "system", "content": CRITIC},
                                         {"role": "user", "content": f"{text}\n\nReview:\n{draft['content']}"}],
                                prompt_version="contract-critic-v1", **params)["content"].strip()
            if verdict.upper().startswith("APPROVE") or round_no == max_rounds:
                break
            critique, previous = verdict.partition(":")[2].strip() or verdict, draft["content"]
        review = {**_parse_review(contract["id"], draft["content"]), "rounds": round_no,
                  "critic": verdict[:200]}
        if review["risk"] >= high_risk:
            escalated += 1
            decision = ctx.request_approval(
                f"Contract {contract['id']} ({contract['counterparty']}) scored risk {review['risk']}/10. "
                "Accept the review and sign off?",
                context={"contract": contract["text"], "review": review}, role="operator")
            review["signed_off_by"] = decision.get("decided_by", [])
            if not decision.get("approved"):
                rejected.append(contract["id"])
                review["status"] = "rejected"
        reviewed += 1
        risk_total += review["risk"]
        ctx.set_state({"reviewed": reviewed, "last": contract["id"], "risk_total": risk_total,
                       "escalated": escalated, "rejected": rejected})
        accept_review(review)
        ctx.set_progress(reviewed, size, "contracts")
    summary = {"reviewed": reviewed, "average_risk": round(risk_total / max(reviewed, 1), 2),
               "escalated": escalated, "rejected": rejected, "seed": seed}
    report = write_report(summary)
    return {**summary, "report": report["path"]}


# -- the offline model ----------------------------------------------------------------------

def _h(*parts: str) -> int:
    return int(hashlib.sha256("|".join(parts).encode()).hexdigest()[:8], 16)


def responder(messages: list[dict], tools: list[dict] | None, params: dict) -> dict | str:
    """Imitates the executor and the critic deterministically from the contract text.

    The executor misses one risky clause on the first draft of about one contract in four; the
    critic notices and sends it back, so some contracts take two rounds, as with a real model.
    """
    tag = system_tag(messages)
    text = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
    cid = (re.search(r"C-\d{4}", text) or re.search(r".", "?")).group(0)
    clauses = [c for c in CLAUSES if c in text]
    risky = [c for c in clauses if CLAUSES[c] > 0]
    if tag == "contract-draft":
        revised = any(str(m.get("content", "")).startswith("Critique:") for m in messages)
        flags = list(risky)
        if not revised and risky and _h(cid, "miss") % 4 == 0:
            flags = flags[:-1]
        risk = min(10, 1 + sum(CLAUSES[c] for c in flags))
        summary = f"{len(flags)} risky clause(s) in {cid}" + (f": {', '.join(flags)}" if flags else ": none")
        return json.dumps({"risk": risk, "flags": flags, "summary": summary})
    if tag == "contract-critic":
        review = parse_json_object(text.partition("Review:")[2]) or {}
        missing = [c for c in risky if c not in review.get("flags", [])]
        if missing:
            return f"REVISE: the review misses '{missing[0]}'"
        return "APPROVE"
    return "I review contracts."
