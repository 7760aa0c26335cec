"""Workflows for replay and input-validation tests."""

import journal


@journal.step()
def echo(value):
    return value


@journal.step()
def not_json():
    return {1, 2, 3}


@journal.workflow(name="nondeterministic_values")
def nondeterministic_values(ctx) -> dict:
    first = {"now": ctx.now().isoformat(), "random": ctx.random(), "uuid": str(ctx.uuid4())}
    ctx.wait_for_signal("go")
    again = {"now": ctx.now().isoformat(), "random": ctx.random(), "uuid": str(ctx.uuid4())}
    return {"first": first, "again": again}


@journal.workflow(name="evolving")
def evolving(ctx, n: int = 3) -> list:
    out = [echo(i) for i in range(n)]
    ctx.wait_for_signal("go")
    return out


def evolving_changed(ctx, n: int = 3) -> list:
    """A deploy that renamed the second step: replay of an in-flight run must notice."""
    out = [echo(0), journal.current() and echo("changed")]
    ctx.wait_for_signal("go")
    return out


@journal.workflow(name="returns_not_json")
def returns_not_json(ctx) -> dict:
    echo(1)
    return not_json()


@journal.workflow(name="typed")
def typed(ctx, order_id: str, amount: int = 1) -> dict:
    return {"order_id": order_id, "amount": echo(amount)}
