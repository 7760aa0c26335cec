"""Tools a model may call: declared as durable steps, dispatched from the model's tool calls.

    @journal.primitives.tools.tool(description="Search the corpus")
    def search(query: str, limit: int = 5) -> list[dict]: ...

    @journal.primitives.tools.tool(effect=True, compensate=unpublish, description="Publish the report")
    def publish(title: str, body: str, *, idempotency_key: str) -> dict: ...

    response, messages = agent_loop(ctx, client, messages, [search, publish])

A tool *is* a ``@journal.step`` (read-only, or ``effect=True`` for exactly-once), so each call
the model makes takes its own step position and replays from the journal. ``dispatch`` also
records a ``tool_call`` session event (which model call asked for it, with which arguments, at
which position) the first time it executes. A call naming an unknown tool or carrying bad
arguments becomes an error message back to the model (deterministically, from the recorded
response): the model can correct itself and nothing half-runs.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from journal.models.session import EventKind
from journal.primitives.decorators import step
from journal.store.errors import StepError, WorkflowDefinitionError

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}
_HIDDEN = {"idempotency_key", "fencing_token"}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict
    fn: Callable[..., Any]  # the step wrapper: journaled inside a workflow
    effect: bool = False
    signature: inspect.Signature = field(default=None, compare=False)  # type: ignore[assignment]

    def spec(self) -> dict:
        """The OpenAI ``tools`` entry for this tool."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def _json_type(annotation: Any) -> dict:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _json_type(args[0]) if len(args) == 1 else {}
    base = origin or annotation
    kind = _JSON_TYPES.get(base)
    return {"type": kind} if kind else {}


def schema_for(fn: Callable[..., Any]) -> dict:
    """A JSON schema of the function's parameters (type hints → JSON types; defaults → optional)."""
    hints = typing.get_type_hints(fn)
    props: dict[str, dict] = {}
    required: list[str] = []
    for name, param in inspect.signature(fn).parameters.items():
        if name in _HIDDEN or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        props[name] = _json_type(hints.get(name, Any))
        if param.default is param.empty:
            required.append(name)
    return {"type": "object", "properties": props, "required": required}


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str = "",
         parameters: dict | None = None, effect: bool = False, **step_options: Any):
    """Declare a tool: a durable step with a name, a description and a JSON schema for the model."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        tool_name = name or func.__name__
        if not tool_name.replace("_", "").replace("-", "").isalnum() or len(tool_name) > 64:
            raise WorkflowDefinitionError(f"tool name {tool_name!r}: use letters, digits, _ or - (at most 64)")
        wrapper = step(func, name=f"tool:{tool_name}", effect=effect, **step_options)
        wrapper.__durable_tool__ = Tool(  # type: ignore[attr-defined]
            name=tool_name, description=description or (inspect.getdoc(func) or "").split("\n\n")[0],
            parameters=parameters or schema_for(func), fn=wrapper, effect=effect,
            signature=inspect.signature(func))
        return wrapper

    return decorate(fn) if fn is not None else decorate


def as_tool(obj: Any) -> Tool:
    found = getattr(obj, "__durable_tool__", None)
    if isinstance(obj, Tool):
        return obj
    if found is None:
        raise WorkflowDefinitionError(f"{obj!r} is not declared with @journal.primitives.tools.tool")
    return found


def specs(tools: list[Any]) -> list[dict]:
    return [as_tool(t).spec() for t in tools]


def assistant_message(response: dict) -> dict:
    """The assistant turn to append to the conversation (OpenAI wire format)."""
    message: dict[str, Any] = {"role": "assistant", "content": response.get("content") or ""}
    if response.get("tool_calls"):
        message["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments") or {}, sort_keys=True)}}
            for c in response["tool_calls"]]
    return message


def dispatch(ctx, response: dict, tools: list[Any]) -> list[dict]:
    """Run the tool calls of a model response as steps; returns the ``tool`` messages to send back."""
    by_name = {t.name: t for t in (as_tool(x) for x in tools)}
    out = []
    for call in response.get("tool_calls") or []:
        name, args, call_id = call.get("name", ""), call.get("arguments"), call.get("id", "")
        found = by_name.get(name)
        if found is None:
            content = {"error": f"unknown tool {name!r}; available: {', '.join(sorted(by_name))}"}
        elif not isinstance(args, dict) or "_unparsed" in args:
            content = {"error": f"arguments for {name} must be a JSON object, got {str(args)[:200]}"}
        else:
            try:
                if set(args) & _HIDDEN:
                    raise TypeError(f"{', '.join(sorted(set(args) & _HIDDEN))} is set by the engine")
                engine_set = {k: None for k in _HIDDEN if k in found.signature.parameters}
                found.signature.bind(**args, **engine_set)
            except TypeError as exc:
                content = {"error": f"bad arguments for {name}: {exc}"}
            else:
                position = ctx.position + 1
                live = position not in ctx.recorded
                try:
                    content = {"result": found.fn(**args)}
                except StepError as exc:
                    content = {"error": f"{exc.error_type}: {exc.message}"}
                if live:
                    ctx.writer.record(EventKind.TOOL_CALL, {
                        "tool": name, "tool_call_id": call_id, "arguments": args, "effect": found.effect,
                        "ok": "error" not in content}, position=position, step_name=f"tool:{name}",
                        durability="exit")
        out.append({"role": "tool", "tool_call_id": call_id, "name": name,
                    "content": json.dumps(content, sort_keys=True, default=str)})
    return out


def agent_loop(ctx, client: Any, messages: list[dict], tools: list[Any], *, max_turns: int = 8,
               **params: Any) -> tuple[dict, list[dict]]:
    """Model → tool calls → results → model … until it answers without tools (or ``max_turns``).

    Returns the last response and the whole conversation. Every turn is journaled, so a
    resumed run replays the conversation without calling the model or re-running tools.
    """
    tool_specs = specs(tools)
    conversation = list(messages)
    response: dict = {}
    for _ in range(max_turns):
        response = ctx.model(client, conversation, tools=tool_specs, **params)
        conversation.append(assistant_message(response))
        if not response.get("tool_calls"):
            break
        conversation.extend(dispatch(ctx, response, tools))
    return response, conversation
