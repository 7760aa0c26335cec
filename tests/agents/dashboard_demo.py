"""Small workflows that give the dashboard tests real journals to show (driven by the real engine)."""

import journal

EVIL = ('<script>window.__pwned = 1</script><img src=x onerror="window.__pwned=2">'
        '<div hx-get="/evil" hx-trigger="load">x</div>')


@journal.step()
def fetch_doc(name: str) -> dict:
    return {"name": name, "words": len(name) * 10}


@journal.step()
def summarize_doc(doc: dict) -> str:
    return f"summary of {doc['name']}"


@journal.step()
def explode(doc: dict) -> str:
    raise ValueError(f"cannot parse {doc['name']}: unexpected token")


@journal.step()
def evil_tool(text: str) -> dict:
    return {"html": EVIL, "note": text}


@journal.workflow(name="dash_ok", version="2")
def dash_ok(ctx: journal.Context, name: str) -> dict:
    doc = fetch_doc(name)
    ctx.set_state({"doc": doc, "stage": "fetched"})
    ctx.set_progress(1, 2, "fetched")
    summary = summarize_doc(doc)
    ctx.set_state({"doc": doc, "stage": "summarized", "summary": summary})
    ctx.set_progress(2, 2, "done")
    return {"summary": summary}


@journal.workflow(name="dash_fail", version="1")
def dash_fail(ctx: journal.Context, name: str) -> str:
    doc = fetch_doc(name)
    summarize_doc(doc)
    return explode(doc)


@journal.workflow(name="dash_approval", version="1")
def dash_approval(ctx: journal.Context, name: str) -> dict:
    doc = fetch_doc(name)
    decision = ctx.wait_for_signal("approval")
    return {"doc": doc["name"], "approved": bool((decision or {}).get("approved")), "decision": decision}


@journal.workflow(name="dash_evil", version="1")
def dash_evil(ctx: journal.Context, text: str) -> dict:
    return evil_tool(text)


@journal.workflow(name="dash_evil_fail", version="1")
def dash_evil_fail(ctx: journal.Context, text: str) -> str:
    evil_tool(text)
    raise RuntimeError(EVIL)


@journal.workflow(name="dash_many", version="1")
def dash_many(ctx: journal.Context, n: int) -> int:
    total = 0
    for i in range(n):
        total += fetch_doc(f"part-{i}")["words"]
        ctx.set_state({"done": i + 1})
    return total


@journal.workflow(name="dash_review", version="1")
def dash_review(ctx: journal.Context, name: str) -> dict:
    doc = fetch_doc(name)
    decision = ctx.request_approval(f"Publish {name}?", context={"doc": doc, "risk": "low"}, role="operator")
    return {"published": bool(decision.get("approved")), "decision": decision}


def refund_card(result, amount, *, idempotency_key):
    return {"refunded": result["charged"]}


@journal.step(effect=True, compensate=refund_card)
def charge_card(amount, *, idempotency_key):
    return {"charged": amount}


@journal.workflow(name="dash_checkout", version="1")
def dash_checkout(ctx: journal.Context, amount: int) -> dict:
    charge = charge_card(amount)
    ctx.wait_for_signal("ship")
    return charge


@journal.workflow(name="dash_grow", version="1")
def dash_grow(ctx: journal.Context, name: str) -> int:
    """Records a step, waits for the signal "more", then records two more: a journal that grows on resume."""
    first = fetch_doc(name)
    ctx.wait_for_signal("more")
    return first["words"] + fetch_doc(name + "-2")["words"] + fetch_doc(name + "-3")["words"]
