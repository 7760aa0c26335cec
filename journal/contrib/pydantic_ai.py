"""Durable Pydantic AI agents: every model request and every tool call of the agent's loop a journaled step.

::

    from pydantic_ai import Agent
    from journal.contrib.pydantic_ai import DurableAgent, idempotency_key

    agent = Agent("openai:gpt-4o", tools=[search, send_email])
    durable = DurableAgent(agent, effects={"send_email": "needs_attention"})   # at module level

    @journal.workflow(name="support")
    def support(ctx, question: str) -> str:
        return durable.run_sync(question).output

Inside a workflow, ``durable.run_sync(...)`` (or ``await durable.run(...)``) runs the agent with its
model wrapped in a ``WrapperModel`` and its toolsets in ``WrapperToolset``\\ s (Pydantic AI's public
extension points, as its own Temporal, DBOS and Prefect integrations use them):

- a model request takes the next step position as ``model:<model name>``; live, it calls the model
  and records the ``ModelResponse`` (JSON, through ``ModelMessagesTypeAdapter``) with tokens and
  cost, like ``ctx.model``; on replay it returns the recorded response and the model is not called.
  The request is fingerprinted without its timestamps and run ids, so a changed prompt is reported
  as non-determinism at its position.
- a tool call takes the next position as ``tool:<name>``; its JSON result is recorded and replayed.
- a tool named in ``effects`` runs through the effect ledger: exactly once per run, with an
  idempotency key the tool reads with ``idempotency_key()``; an effect interrupted mid-call follows
  its policy (``needs_attention``, the default, or ``retry`` under the same key).

Tool calls run one at a time (Pydantic AI's ``sequential`` mode), so positions are deterministic.
Streaming: an ``event_stream_handler`` receives the live events on the first execution; on replay
it sees the recorded response again only with ``DurableAgent(..., replay_events=True)``.

The engine's journal is synchronous and bound to the workflow's thread; the agent loop is async.
``run_sync`` runs the loop with asgiref's ``async_to_sync``, and every journal operation goes back
to the workflow's thread with ``sync_to_async(thread_sensitive=True)``. A call that fails is not
recorded: on resume it runs again. An effect tool's body runs on an event loop of its own.
Outside a workflow (or inside another step) ``DurableAgent`` runs the agent as it is.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.utils import timezone

from journal.engine.protocol import begin, recorded_result, result_payload, span
from journal.engine.registry import IN_DOUBT_POLICIES, StepDef
from journal.models.session import EventKind
from journal.models.trace import SpanKind
from journal.primitives.context import current, current_or_none
from journal.primitives.effects import run_effect
from journal.primitives.llm import record_model_call
from journal.store.errors import DurableError, WorkflowDefinitionError
from journal.store.serialization import fingerprint, to_json

try:
    from pydantic_ai.agent import AbstractAgent
    from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse
    from pydantic_ai.models import CompletedStreamedResponse, Model, ModelRequestParameters, StreamedResponse
    from pydantic_ai.models.wrapper import WrapperModel
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.toolsets import AbstractToolset
    from pydantic_ai.toolsets.wrapper import WrapperToolset
    from pydantic_core import to_jsonable_python
except ImportError as exc:  # the extra is not installed
    raise ImportError("journal.contrib.pydantic_ai needs Pydantic AI: pip install 'durable-ui[pydantic-ai]'") from exc

__all__ = ["DurableAgent", "JournaledModel", "JournaledToolset", "idempotency_key"]

# Fields of a request that differ between two executions of the same agent loop: left out of its fingerprint.
_VOLATILE = frozenset({"timestamp", "run_id", "conversation_id"})
_effect_key: ContextVar[str | None] = ContextVar("durable_pydantic_ai_effect_key", default=None)


def idempotency_key() -> str:
    """Inside a tool that ``DurableAgent`` runs as an effect: the key the outside system dedups on."""
    key = _effect_key.get()
    if key is None:
        raise DurableError("idempotency_key() works only inside a tool that DurableAgent runs as an effect "
                           "(name it in DurableAgent(agent, effects=...))")
    return key


def _in_workflow() -> bool:
    ctx = current_or_none()
    return ctx is not None and not ctx.in_step


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _canonical(value: Any) -> Any:
    """Keys in sorted order, live and on replay alike: PostgreSQL's jsonb gives a record's keys back in
    an order of its own, and a tool result the model reads must read the same after a resume."""
    if isinstance(value, dict):
        return {k: _canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _recorded(record: dict) -> Any:
    return _canonical(recorded_result(record))


def _on_workflow_thread(fn):
    """The journal lives on the workflow's thread (its database connection, its ContextVar)."""
    return sync_to_async(fn, thread_sensitive=True)


# -- model requests --------------------------------------------------------------------------------

def _begin(step_name: str, args_hash: str | None) -> tuple[int, dict | None]:
    return begin(current(), step_name, args_hash)


def _response_from(record: dict) -> ModelResponse:
    return ModelMessagesTypeAdapter.validate_python(_recorded(record))[0]


def _record_response(position: int, step_name: str, model_name: str, request: dict, args_hash: str,
                     response: ModelResponse, started, ms: float) -> None:
    result = to_json(ModelMessagesTypeAdapter.dump_python([response], mode="json"),
                     what=f"the response of {step_name}")
    usage = response.usage
    record_model_call(current(), position, step_name, model=model_name, request=request, args_hash=args_hash,
                      result=result, tokens_in=int(usage.input_tokens or 0), tokens_out=int(usage.output_tokens or 0),
                      response_model=response.model_name or model_name, finish_reason=response.finish_reason or "",
                      tool_calls=len(response.tool_calls), prompt_version="", attempt=1, started=started, ms=ms)


class JournaledModel(WrapperModel):
    """A model whose every request is a journaled step (replayed from the journal on resume)."""

    def __init__(self, wrapped: Model | str, *, replay_events: bool = False):
        super().__init__(wrapped)
        self.replay_events = replay_events

    def _describe(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                  params: ModelRequestParameters) -> tuple[str, dict, str]:
        model_name = self.wrapped.model_name
        step_name = f"model:{model_name}"[:200]
        request = to_json({
            "model": model_name,
            "messages": ModelMessagesTypeAdapter.dump_python(messages, mode="json"),
            "tools": [tool.name for tool in params.function_tools],
            "params": to_jsonable_python(model_settings or {}),
            "prompt_version": "",
        }, what=f"the request of {step_name}")
        return step_name, request, fingerprint(_stable(request))

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        if not _in_workflow():
            return await self.wrapped.request(messages, model_settings, model_request_parameters)
        step_name, request, args_hash = self._describe(messages, model_settings, model_request_parameters)
        position, record = await _on_workflow_thread(_begin)(step_name, args_hash)
        if record is not None:
            return _response_from(record)
        started, t0 = timezone.now(), time.perf_counter()
        response = await self.wrapped.request(messages, model_settings, model_request_parameters)
        await _on_workflow_thread(_record_response)(position, step_name, self.wrapped.model_name, request, args_hash,
                                                    response, started, (time.perf_counter() - t0) * 1000)
        return response

    @asynccontextmanager
    async def request_stream(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                             model_request_parameters: ModelRequestParameters,
                             run_context: Any = None) -> AsyncIterator[StreamedResponse]:
        if not _in_workflow():
            async with self.wrapped.request_stream(messages, model_settings, model_request_parameters,
                                                   run_context) as stream:
                yield stream
            return
        step_name, request, args_hash = self._describe(messages, model_settings, model_request_parameters)
        position, record = await _on_workflow_thread(_begin)(step_name, args_hash)
        if record is not None:
            yield CompletedStreamedResponse(_response_from(record), model_request_parameters=model_request_parameters,
                                            replay_events=self.replay_events)
            return
        started, t0 = timezone.now(), time.perf_counter()
        async with self.wrapped.request_stream(messages, model_settings, model_request_parameters,
                                               run_context) as stream:
            yield stream  # the agent (and its event_stream_handler) consume the live stream here
        # Recorded only once the stream has been consumed to its end: a half-read stream is not a response.
        await _on_workflow_thread(_record_response)(position, step_name, self.wrapped.model_name, request, args_hash,
                                                    stream.get(), started, (time.perf_counter() - t0) * 1000)


# -- tool calls ------------------------------------------------------------------------------------

def _record_tool(position: int, step_name: str, args_json: dict, args_hash: str, result: Any, started,
                 ms: float) -> None:
    ctx = current()
    payload = {**result_payload(result), "args_hash": args_hash, "attempt": 1, "kind": "tool",
               "started_at": started.isoformat(), "duration_ms": round(ms, 3), "args": {"args": args_json}}
    span(ctx, step_name, SpanKind.TOOL, position, started, ms)
    ctx.writer.record(EventKind.STEP_COMPLETED, payload, position=position, step_name=step_name)


def _run_effect_tool(toolset: AbstractToolset, name: str, tool_args: dict, run_ctx: Any, tool: Any, policy: str,
                     step_name: str, args_json: dict, args_hash: str) -> Any:
    """The ledger protocol (journal.primitives.effects) around one tool call, on the workflow's thread."""
    ctx = current()
    position, record = begin(ctx, step_name, args_hash)
    if record is not None:
        return _recorded(record)

    def execute(*, args: dict, idempotency_key: str) -> Any:
        token = _effect_key.set(idempotency_key)
        try:  # the tool is async; this thread has no loop of its own, so it gets one for the call
            return _canonical(to_jsonable_python(async_to_sync(toolset.call_tool)(name, tool_args, run_ctx, tool)))
        finally:
            _effect_key.reset(token)

    defn = StepDef(name=step_name, fn=execute, effect=True, on_in_doubt=policy, accepts_idempotency_key=True)
    return _canonical(run_effect(ctx, defn, position, {"args": [], "kwargs": {"args": args_json}}, args_hash))


class JournaledToolset(WrapperToolset):
    """A toolset whose every call is a journaled step; tools named in ``effects`` go through the ledger."""

    def __init__(self, wrapped: AbstractToolset, effects: Mapping[str, str] | None = None):
        super().__init__(wrapped)
        self.effects = dict(effects or {})

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        jctx = current_or_none()
        if jctx is None or jctx.in_step:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        step_name = f"tool:{name}"[:200]
        args_json = to_json(to_jsonable_python(tool_args), what=f"the arguments of {step_name}")
        args_hash = fingerprint({"tool": name, "args": args_json})
        policy = self.effects.get(name)
        if policy is not None:
            return await _on_workflow_thread(_run_effect_tool)(self.wrapped, name, tool_args, ctx, tool, policy,
                                                               step_name, args_json, args_hash)
        position, record = await _on_workflow_thread(_begin)(step_name, args_hash)
        if record is not None:
            return _recorded(record)
        started, t0 = timezone.now(), time.perf_counter()
        jctx.in_step = True  # a @journal.step the tool calls is part of this record, not a position of its own
        try:
            result = await self.wrapped.call_tool(name, tool_args, ctx, tool)
        finally:
            jctx.in_step = False
        # Live and replay hand the agent the same, storable value.
        result = _canonical(to_json(to_jsonable_python(result), what=f"the result of {step_name}"))
        await _on_workflow_thread(_record_tool)(position, step_name, args_json, args_hash, result, started,
                                                (time.perf_counter() - t0) * 1000)
        return result


# -- the agent -------------------------------------------------------------------------------------

def _effect_policies(effects: Iterable[str] | Mapping[str, str]) -> dict[str, str]:
    policies = dict(effects) if isinstance(effects, Mapping) else dict.fromkeys(effects, "needs_attention")
    allowed = tuple(p for p in IN_DOUBT_POLICIES if p != "reconcile")
    for tool_name, policy in policies.items():
        if policy not in allowed:
            raise WorkflowDefinitionError(f"effect tool {tool_name}: the in-doubt policy must be one of {allowed}, "
                                          f"not {policy!r}")
    return policies


class DurableAgent:
    """A Pydantic AI agent whose runs inside a workflow are journaled; build it once, at module level."""

    def __init__(self, agent: AbstractAgent, *, effects: Iterable[str] | Mapping[str, str] = (),
                 replay_events: bool = False):
        self.agent = agent
        self.effects = _effect_policies(effects)
        self.replay_events = replay_events
        # agent.toolsets holds the agent's own function tools first: wrapped here, and replaced by
        # an empty tool list in the override below, so no call escapes the journal.
        self._toolsets = [JournaledToolset(toolset, self.effects) for toolset in agent.toolsets]

    @property
    def name(self) -> str | None:
        return self.agent.name

    async def run(self, user_prompt: Any = None, *, model: Model | str | None = None, **kwargs: Any) -> Any:
        """``agent.run`` with each model request and tool call journaled (inside a workflow)."""
        if not _in_workflow():
            return await self.agent.run(user_prompt, model=model, **kwargs)
        chosen = model if model is not None else self.agent.model
        if chosen is None:
            raise WorkflowDefinitionError("DurableAgent: the agent has no model; pass model= to the agent or the run")
        if kwargs.get("toolsets"):
            kwargs["toolsets"] = [JournaledToolset(t, self.effects) for t in kwargs["toolsets"]]
        journaled = JournaledModel(chosen, replay_events=self.replay_events)
        with (self.agent.override(model=journaled, tools=[], toolsets=self._toolsets),
              self.agent.parallel_tool_call_execution_mode("sequential")):
            return await self.agent.run(user_prompt, **kwargs)

    def run_sync(self, user_prompt: Any = None, **kwargs: Any) -> Any:
        """``agent.run_sync`` for workflow code: the agent's loop on an event loop of its own, the journal here."""
        return async_to_sync(self.run)(user_prompt, **kwargs)
