"""A code-repair agent: writes a small buggy project, runs its tests in the sandbox, edits, re-runs until green.

Every command first prints a digest of the whole sandbox tree, so the recorded output of each
step is a witness of the files that step saw: a recovered run must reproduce an uninterrupted
run's witnesses byte for byte. The test command appends to log files (not idempotent), so a
command re-run against files that were not restored shows up as a different digest.

CODEREPAIR_SLOW (seconds, default 0) makes each test run sleep, so random external kills land
inside commands as well as between them.
"""

import os
import shlex

import journal

CALC = '''\
def add(a, b):
    return a - b


def mul(a, b):
    return b + a


def mean(xs):
    return sum(xs) / (len(xs) + 1)
'''

TESTS = '''\
import sys
import time

import calc

time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
failures = []
for name, got, want in [("add", calc.add(2, 3), 5), ("mul", calc.mul(2, 3), 6), ("mean", calc.mean([1, 2, 3]), 2)]:
    if got != want:
        failures.append(f"{name}: got {got!r}, want {want!r}")
print("\\n".join(failures) or "all green")
sys.exit(1 if failures else 0)
'''

FIXES = [  # sed basic regular expressions: parentheses and '+' are literal
    ("return a - b", "return a + b"),
    ("return b + a", "return a * b"),
    ("(len(xs) + 1)", "len(xs)"),
]

TREE = "find . -type f ! -name '*.pyc' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16"


@journal.step()
def plan(goal: str) -> str:
    """A model-ish step: changes nothing recoverable, so `selective` skips its checkpoint."""
    return f"plan for {goal}: run tests, fix the first failure, repeat"


@journal.step()
def read_failure(output: str) -> str:
    return output.strip().splitlines()[0] if output.strip() else ""


@journal.step()
def choose_fix(failure: str, source: str) -> int:
    """Which of FIXES addresses this failure (the agent's 'model' deciding on an edit)."""
    name = failure.split(":", 1)[0]
    return {"add": 0, "mul": 1, "mean": 2}.get(name, -1)


def _run(ctx, command: str):
    return ctx.sandbox.run(f"echo tree=$({TREE}); {command}", timeout=60)


@journal.workflow(name="coderepair", checkpoint="selective")
def coderepair(ctx: journal.Context, goal: str = "make the tests pass") -> dict:
    slow = os.environ.get("CODEREPAIR_SLOW", "0")
    plan(goal)
    ctx.sandbox.write_file("calc.py", CALC)
    ctx.sandbox.write_file("test_calc.py", TESTS)
    witnesses = []
    attempts = 0
    failure = ""
    for _ in range(len(FIXES) + 1):
        attempts += 1
        result = _run(ctx, f"echo attempt >> runs.log; python3 -B test_calc.py {slow} | tee -a test.log")
        witnesses.append(result.stdout)
        failure = read_failure(result.stdout.split("\n", 1)[1] if "\n" in result.stdout else "")
        if failure == "all green":
            break
        source = _run(ctx, "grep -n 'return' calc.py")  # read-only: nothing to checkpoint
        witnesses.append(source.stdout)
        old, new = FIXES[choose_fix(failure, source.stdout)]
        ctx.set_state({"attempts": attempts, "last_failure": failure})
        edit = _run(ctx, f"sed -i {shlex.quote(f's/{old}/{new}/')} calc.py && mkdir -p notes && "
                         f"echo {shlex.quote(failure)} >> notes/fixes.txt")
        witnesses.append(edit.stdout)
    final = _run(ctx, "wc -l runs.log test.log notes/fixes.txt | tail -1")
    witnesses.append(final.stdout)
    return {"attempts": attempts, "green": failure == "all green", "witnesses": witnesses}


@journal.workflow(name="sandbox_hang")
def sandbox_hang(ctx: journal.Context) -> int:
    """A command that never ends by itself: the crash tests kill its worker underneath it."""
    return ctx.sandbox.run("while true; do date >> tick.txt; sleep 0.05; done", timeout=600).exit_code
