"""A shell code-repair agent: reads a small buggy project in its sandbox, runs the tests, edits, re-runs.

    run_id = journal.start("code_repair")

Every sandbox command and file write is a durable step (``ctx.sandbox``): a resumed run does not
re-run commands, and its working directory is restored from the latest checkpoint. Checkpoints
are *selective*: taken after steps that changed files (writes, edits), skipped after read-only
ones (running the tests, reading a file), which the run page shows step by step.

The model sees the failing test output and the source, and answers with one edit as JSON:
``{"path": "calc.py", "find": "<exact text>", "replace": "<new text>"}``.
"""

from __future__ import annotations

import json
from typing import Any

import journal
from examples.llm import client_for, parse_json_object, system_tag

PROJECT = {
    "calc.py": (
        '"""A tiny statistics module with three bugs."""\n\n\n'
        "def add(a, b):\n    return a - b\n\n\n"
        "def mean(values):\n    return sum(values) / (len(values) - 1)\n\n\n"
        "def clamp(x, low, high):\n    return max(low, min(x, low))\n"
    ),
    "test_calc.py": (
        "import sys\n\nfrom calc import add, clamp, mean\n\nfailures = 0\n\n\n"
        "def check(name, got, want):\n    global failures\n    if got != want:\n"
        "        failures += 1\n        print(f'FAIL {name}: got {got!r}, want {want!r}')\n"
        "    else:\n        print(f'ok   {name}')\n\n\n"
        "check('add', add(2, 3), 5)\ncheck('mean', mean([2, 4, 6]), 4)\ncheck('clamp', clamp(15, 0, 10), 10)\n"
        "sys.exit(1 if failures else 0)\n"
    ),
}

FIXES = {  # what the offline model knows how to fix, by failing test
    "add": ("return a - b", "return a + b"),
    "mean": ("(len(values) - 1)", "len(values)"),
    "clamp": ("min(x, low)", "min(x, high)"),
}

REPAIR = ("[code-repair] You fix Python code. Given failing test output and the source, reply with JSON only: "
          '{"path": "<file>", "find": "<exact text to replace>", "replace": "<new text>"}. One edit per reply.')


@journal.workflow(name="code_repair", version="1", checkpoint="selective",
                  description="Run a project's tests in a sandbox, let the model edit, re-run until green")
def code_repair(ctx: journal.Context, max_iterations: int = 6, model: str | None = None) -> dict:
    client = client_for(responder)
    params: dict[str, Any] = {"temperature": 0}
    if model:
        params["model"] = model
    sandbox = ctx.sandbox
    for path, text in PROJECT.items():
        sandbox.write_file(path, text)
    edits = []
    for iteration in range(1, max_iterations + 1):
        result = sandbox.run("python3 -B test_calc.py", timeout=60)  # -B: no stale .pyc after a same-size edit
        ctx.set_progress(iteration, max_iterations, "test runs")
        if result.exit_code == 0:
            return {"green": True, "iterations": iteration, "edits": edits, "output": result.stdout[-2000:]}
        source = sandbox.read_file("calc.py")
        prompt = f"Test output:\n{result.stdout}{result.stderr}\n\ncalc.py:\n{source}"
        reply = ctx.model(client, [{"role": "system", "content": REPAIR}, {"role": "user", "content": prompt}],
                          prompt_version="code-repair-v1", **params)
        edit = parse_json_object(reply["content"]) or {}
        path, find, replace = edit.get("path", "calc.py"), edit.get("find", ""), edit.get("replace", "")
        if path not in PROJECT or not find:
            ctx.log("the model proposed no usable edit", reply=reply["content"][:500])
            continue
        current = sandbox.read_file(path)
        if find not in current:
            ctx.log("the model's edit does not apply", find=find[:200])
            continue
        sandbox.write_file(path, current.replace(find, replace, 1))
        edits.append({"path": path, "find": find, "replace": replace})
    return {"green": False, "iterations": max_iterations, "edits": edits}


def responder(messages: list[dict], tools: list[dict] | None, params: dict) -> dict | str:
    """Fixes the first failing test it recognises, as a careful model would: one edit at a time."""
    if system_tag(messages) != "code-repair":
        return "I fix code."
    text = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
    for line in text.splitlines():
        if line.startswith("FAIL "):
            name = line[5:].split(":")[0]
            if name in FIXES:
                find, replace = FIXES[name]
                return json.dumps({"path": "calc.py", "find": find, "replace": replace})
    return json.dumps({"path": "calc.py", "find": "", "replace": ""})
