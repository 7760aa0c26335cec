"""The workflow bench/instructions.py counts: ten (or ``n``) trivial steps. Imported by its child
once Django is set up, from whichever durable-ui tree the child measures."""

from __future__ import annotations

import journal


@journal.step()
def tiny(i: int) -> int:
    return i + 1


@journal.workflow(name="bench_instructions", durability="sync")
def short(ctx, n: int) -> int:
    return sum(tiny(i) for i in range(n))
