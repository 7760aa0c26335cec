"""The agent bench/start_latency.py starts: one tiny step. A module of its own, so that a `runworker`
process finds it too (DURABLE_AGENT_MODULES)."""

from __future__ import annotations

import journal


@journal.step()
def tiny(i: int) -> int:
    return i + 1


@journal.workflow(name="bench_latency")
def bench_latency(ctx, n: int) -> int:
    return tiny(n)
