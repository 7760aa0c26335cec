"""Model clients: the official openai and anthropic SDKs behind one normalised shape, and an offline scripted client.

Every client has ``model`` (its default model id) and ``complete(messages, *, model, tools, **params)``
returning one *normalised* response dict, whatever the wire looked like (plain JSON or an SSE
stream)::

    {"model": "gpt-4o-mini", "content": "text or ''", "finish_reason": "stop" | "tool_calls" | ...,
     "tool_calls": [{"id": "call_1", "name": "search", "arguments": {...}}],
     "usage": {"prompt_tokens": 12, "completion_tokens": 34}}

That dict is what ``ctx.model`` records in the journal, so replay returns exactly it. Clients do
no journaling themselves: they are plain I/O, safe to use outside a workflow.

``ctx.model`` also takes the official SDK clients as they are (``openai.OpenAI``/``AsyncOpenAI``,
``anthropic.Anthropic``/``AsyncAnthropic``; ``as_chat_client`` adapts them); the SDKs do the wire,
retries (429 and 5xx, honouring ``Retry-After``), timeouts and streaming. ``OpenAIClient`` is a thin
adapter over ``openai.OpenAI(base_url=...)`` for any OpenAI-compatible server, configured with
``DURABLE_LLM_BASE_URL`` (e.g. ``http://localhost:11434/v1`` for Ollama, a vLLM server, or a hosted
API), ``DURABLE_LLM_API_KEY`` and ``DURABLE_LLM_MODEL``.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from django.conf import settings

from journal.store.errors import DurableError

if TYPE_CHECKING:
    import openai


def _sdk(name: str) -> Any:
    """An SDK module (openai, anthropic, genai_prices), imported when first needed. Together they take
    about 1.8 s to import, which every worker, web process and manage.py command paid at start (a
    restarted worker resumed its runs that much later) whether or not a workflow ever called a model."""
    return importlib.import_module(name)


def _loaded(name: str) -> Any | None:
    """The SDK module if this process has imported it: only then can an object be one of its clients."""
    return sys.modules.get(name)

# Prices come from genai-prices (kept up to date upstream). This table only overrides it: the
# offline demo models keep a price so the dashboard's cost charts mean something. USD per million
# tokens (input, output); the DURABLE_MODEL_PRICES setting (and DURABLE_LLM_PRICES='{"m": [in, out]}'
# in the environment) add to it or override a model.
OVERRIDE_PRICES: dict[str, tuple[float, float]] = {
    "scripted-small": (0.15, 0.60),
    "scripted-large": (2.50, 10.00),
    "llama3.1:8b": (0.0, 0.0),
}


class ModelError(DurableError):
    """The model endpoint refused the request or could not be reached (after retries)."""

    def __init__(self, message: str, status: int | None = None):
        self.status = status
        super().__init__(message)


class ChatClient(Protocol):
    model: str

    def complete(self, messages: list[dict], *, model: str, tools: list[dict] | None = None,
                 **params: Any) -> dict: ...


def prices() -> dict[str, tuple[float, float]]:
    """The override table: the demo models, then the DURABLE_MODEL_PRICES setting, then the environment."""
    table = dict(OVERRIDE_PRICES)
    if settings.configured:
        for name, pair in (getattr(settings, "DURABLE_MODEL_PRICES", None) or {}).items():
            table[name] = (float(pair[0]), float(pair[1]))
    extra = os.environ.get("DURABLE_LLM_PRICES", "")
    if extra:
        try:
            for name, pair in json.loads(extra).items():
                table[name] = (float(pair[0]), float(pair[1]))
        except (ValueError, TypeError, IndexError, AttributeError) as exc:
            raise ModelError(f"DURABLE_LLM_PRICES must be JSON like {{\"model\": [in, out]}}: {exc}") from None
    return table


def cost_of(model: str, tokens_in: int, tokens_out: int, table: dict | None = None) -> float:
    """Cost in USD: the override table (exact id, else its longest prefix), else genai-prices; 0 if unknown."""
    table = table if table is not None else prices()
    price = table.get(model)
    if price is None:
        matches = [name for name in table if model.startswith(name)]
        price = table[max(matches, key=len)] if matches else None
    if price is not None:
        return round((tokens_in * price[0] + tokens_out * price[1]) / 1_000_000, 6)
    try:
        genai_prices = _sdk("genai_prices")
        usage = genai_prices.Usage(input_tokens=tokens_in, output_tokens=tokens_out)
        found = genai_prices.calc_price(usage, model_ref=model)
    except LookupError:
        return 0.0  # an unknown model still records its tokens
    return round(float(found.total_price), 6)


def _tool_calls(raw: Iterable[dict] | None) -> list[dict]:
    calls = []
    for i, call in enumerate(raw or []):
        fn = call.get("function") or {}
        args = fn.get("arguments") or "{}"
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            parsed = {"_unparsed": args}  # the model wrote bad JSON: keep it, the tool dispatcher reports it
        calls.append({"id": call.get("id") or f"call_{i}", "name": fn.get("name", ""), "arguments": parsed})
    return calls


def normalise(body: dict, model: str) -> dict:
    """A chat-completions JSON response → the normalised dict."""
    choices = body.get("choices") or []
    if not choices:
        raise ModelError(f"the model returned no choices: {str(body)[:300]}")
    message = choices[0].get("message") or {}
    usage = body.get("usage") or {}
    return {
        "model": body.get("model") or model,
        "content": message.get("content") or "",
        "finish_reason": choices[0].get("finish_reason") or "stop",
        "tool_calls": _tool_calls(message.get("tool_calls")),
        "usage": {"prompt_tokens": int(usage.get("prompt_tokens") or 0),
                  "completion_tokens": int(usage.get("completion_tokens") or 0)},
    }


def aggregate_stream(chunks: Iterable[dict], model: str) -> dict:
    """Fold a stream of chat-completion chunks (as dicts) into one normalised response."""
    content: list[str] = []
    calls: dict[int, dict] = {}
    finish = "stop"
    usage: dict = {}
    seen_model = model
    for chunk in chunks:
        seen_model = chunk.get("model") or seen_model
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                empty = {"id": "", "function": {"name": "", "arguments": ""}}
                slot = calls.setdefault(int(tc.get("index") or 0), empty)
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    return {
        "model": seen_model,
        "content": "".join(content),
        "finish_reason": finish,
        "tool_calls": _tool_calls([calls[i] for i in sorted(calls)]),
        "usage": {"prompt_tokens": int(usage.get("prompt_tokens") or 0),
                  "completion_tokens": int(usage.get("completion_tokens") or 0)},
    }


_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _run_async(coro: Any) -> Any:
    """Run an async SDK call from synchronous workflow code, on one long-lived event loop: an async
    client's connection pool belongs to the loop it first ran on, so a fresh loop per call would break it."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="model-sdk-loop", daemon=True).start()
    return asyncio.run_coroutine_threadsafe(coro, _loop).result()


def _sdk_error(exc: Exception, where: str) -> ModelError:
    """The SDKs' errors (after their own retries) as the engine's ModelError, with the status."""
    status = getattr(exc, "status_code", None)
    if status is not None:
        return ModelError(f"model endpoint answered {status}: {str(exc)[:500]}", status=status)
    return ModelError(f"model endpoint unreachable at {where}: {exc}")


class OpenAISDKClient:
    """``ctx.model`` over an official ``openai.OpenAI`` / ``openai.AsyncOpenAI`` client, used as it is.

    The SDK does the wire, retries (429 and 5xx, honouring ``Retry-After``), timeouts and streaming.
    """

    def __init__(self, sdk: Any, model: str = "", *, stream: bool = False):
        self.sdk = sdk
        self.model = model
        self.stream = stream
        self.is_async = isinstance(sdk, _sdk("openai").AsyncOpenAI)

    def complete(self, messages: list[dict], *, model: str, tools: list[dict] | None = None,
                 **params: Any) -> dict:
        if not model:
            raise ModelError("an openai client has no default model: pass model= to ctx.model")
        stream = bool(params.pop("stream", self.stream))
        body: dict[str, Any] = {"model": model, "messages": messages, **params}
        if tools:
            body["tools"] = tools
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        try:
            if self.is_async:
                return _run_async(self._acomplete(body, stream))
            reply = self.sdk.chat.completions.create(**body)
            if stream:
                return aggregate_stream((chunk.model_dump() for chunk in reply), model)
            return normalise(reply.model_dump(), model)
        except _sdk("openai").OpenAIError as exc:
            raise _sdk_error(exc, str(self.sdk.base_url)) from None

    async def _acomplete(self, body: dict, stream: bool) -> dict:
        reply = await self.sdk.chat.completions.create(**body)
        if stream:
            return aggregate_stream([chunk.model_dump() async for chunk in reply], body["model"])
        return normalise(reply.model_dump(), body["model"])


_SDK_CLIENTS: dict[tuple, openai.OpenAI] = {}
_SDK_CLIENTS_LOCK = threading.Lock()


def _shared_sdk_client(base_url: str, api_key: str, timeout: float, max_retries: int) -> openai.OpenAI:
    """One SDK client (one connection pool) per server and settings for the process's life: workflows
    build an ``OpenAIClient`` on every resume, and a pool per build would open, and leak, a connection
    per run."""
    key = (base_url, api_key, timeout, max_retries)
    with _SDK_CLIENTS_LOCK:
        client = _SDK_CLIENTS.get(key)
        if client is None:
            client = _SDK_CLIENTS[key] = _sdk("openai").OpenAI(base_url=base_url, api_key=api_key, timeout=timeout,
                                                       max_retries=max_retries)
        return client


class OpenAIClient(OpenAISDKClient):
    """Any server speaking OpenAI's chat completions (Ollama, vLLM, hosted), through the ``openai`` SDK."""

    def __init__(self, base_url: str, api_key: str = "", model: str = "gpt-4o-mini", *, timeout: float = 60.0,
                 max_retries: int = 4, stream: bool = False):
        if not base_url.startswith(("http://", "https://")):
            raise ModelError(f"the model base URL must start with http:// or https://, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        # The SDK insists on a key; a local server does not: any placeholder will do there.
        super().__init__(_shared_sdk_client(self.base_url, api_key or "not-needed", timeout, max_retries), model,
                         stream=stream)

    @classmethod
    def from_env(cls, **overrides: Any) -> OpenAIClient:
        base = os.environ.get("DURABLE_LLM_BASE_URL", "")
        if not base:
            raise ModelError("DURABLE_LLM_BASE_URL is not set")
        options: dict[str, Any] = {
            "api_key": os.environ.get("DURABLE_LLM_API_KEY", ""),
            "model": os.environ.get("DURABLE_LLM_MODEL", "gpt-4o-mini"),
            "timeout": float(os.environ.get("DURABLE_LLM_TIMEOUT", "60")),
            "stream": os.environ.get("DURABLE_LLM_STREAM", "") in ("1", "true", "yes"),
        }
        options.update(overrides)
        return cls(base, **options)


_ANTHROPIC_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length"}


def _anthropic_messages(messages: list[dict]) -> tuple[str, list[dict]]:
    """Chat-completions messages (what ctx.model takes) as the Messages API's system text and turns."""
    system = [str(m.get("content") or "") for m in messages if m.get("role") == "system"]
    turns: list[dict] = []
    for m in messages:
        role = m.get("role")
        if role == "system":
            continue
        if role == "tool":
            block = {"type": "tool_result", "tool_use_id": m.get("tool_call_id", ""), "content": str(m.get("content"))}
            turns.append({"role": "user", "content": [block]})
        elif role == "assistant" and m.get("tool_calls"):
            blocks = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            for call in m["tool_calls"]:
                fn = call.get("function") or call
                args = fn.get("arguments") or {}
                blocks.append({"type": "tool_use", "id": call.get("id", ""), "name": fn.get("name", ""),
                               "input": json.loads(args) if isinstance(args, str) else args})
            turns.append({"role": "assistant", "content": blocks})
        else:
            turns.append({"role": role or "user", "content": m.get("content") or ""})
    return "\n\n".join(system), turns


def _anthropic_tools(tools: list[dict]) -> list[dict]:
    out = []
    for tool in tools:
        fn = tool.get("function", tool)
        out.append({"name": fn.get("name", ""), "description": fn.get("description", ""),
                    "input_schema": fn.get("parameters") or fn.get("input_schema") or {"type": "object"}})
    return out


def normalise_anthropic(body: dict, model: str) -> dict:
    """A Messages API response → the normalised dict."""
    blocks = body.get("content") or []
    usage = body.get("usage") or {}
    return {
        "model": body.get("model") or model,
        "content": "".join(b.get("text", "") for b in blocks if b.get("type") == "text"),
        "finish_reason": _ANTHROPIC_FINISH.get(body.get("stop_reason") or "", body.get("stop_reason") or "stop"),
        "tool_calls": [{"id": b.get("id", ""), "name": b.get("name", ""), "arguments": b.get("input") or {}}
                       for b in blocks if b.get("type") == "tool_use"],
        "usage": {"prompt_tokens": int(usage.get("input_tokens") or 0),
                  "completion_tokens": int(usage.get("output_tokens") or 0)},
    }


class AnthropicSDKClient:
    """``ctx.model`` over an official ``anthropic.Anthropic`` / ``anthropic.AsyncAnthropic`` client.

    ``ctx.model`` takes chat-completions messages and tools; they are translated to the Messages API
    (the system message becomes ``system``); ``max_tokens`` defaults to 1024.
    """

    def __init__(self, sdk: Any, model: str = ""):
        self.sdk = sdk
        self.model = model
        self.is_async = isinstance(sdk, _sdk("anthropic").AsyncAnthropic)

    def complete(self, messages: list[dict], *, model: str, tools: list[dict] | None = None,
                 **params: Any) -> dict:
        if not model:
            raise ModelError("an anthropic client has no default model: pass model= to ctx.model")
        system, turns = _anthropic_messages(messages)
        body: dict[str, Any] = {"model": model, "messages": turns, "max_tokens": 1024, **params}
        if system:
            body["system"] = system
        if tools:
            body["tools"] = _anthropic_tools(tools)
        try:
            create = self.sdk.messages.create
            reply = _run_async(create(**body)) if self.is_async else create(**body)
        except _sdk("anthropic").AnthropicError as exc:
            raise _sdk_error(exc, str(self.sdk.base_url)) from None
        return normalise_anthropic(reply.model_dump(), model)


def as_chat_client(client: Any) -> ChatClient:
    """What ``ctx.model`` calls: an official SDK client adapted, anything with ``complete`` as it is."""
    openai_sdk, anthropic_sdk = _loaded("openai"), _loaded("anthropic")
    if openai_sdk is not None and isinstance(client, openai_sdk.OpenAI | openai_sdk.AsyncOpenAI):
        return OpenAISDKClient(client)
    if anthropic_sdk is not None and isinstance(client, anthropic_sdk.Anthropic | anthropic_sdk.AsyncAnthropic):
        return AnthropicSDKClient(client)
    if not callable(getattr(client, "complete", None)):
        raise ModelError(f"ctx.model needs an openai or anthropic client, or one with complete(); got {client!r}")
    return client


def approx_tokens(text: str) -> int:
    """About four characters a token: good enough for a demo's cost chart."""
    return max(1, len(text) // 4)


Responder = Callable[[list[dict], list[dict] | None, dict], dict | str]


def default_responder(messages: list[dict], tools: list[dict] | None, params: dict) -> dict | str:
    """Call each offered tool once (in order), then answer with a summary of what came back."""
    called = {m.get("name") for m in messages if m.get("role") == "tool"}
    for tool in tools or []:
        name = tool.get("function", {}).get("name", "")
        if name and name not in called:
            last_user = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
            return {"tool_calls": [{"id": f"call_{name}", "name": name, "arguments": {"query": str(last_user)[:200]}}]}
    last = messages[-1].get("content", "") if messages else ""
    digest = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:8]
    return f"Summary ({digest}): {str(last)[:400]}"


class ScriptedClient:
    """An offline client: deterministic, realistic responses with token usage, and no network.

    ``responder(messages, tools, params)`` returns the reply text, or a dict with ``content``
    and/or ``tool_calls`` (``[{"name", "arguments", "id"?}]``). The same inputs always give
    the same response, so a run driven by a fresh process after a crash behaves the same.
    """

    def __init__(self, responder: Responder | None = None, model: str = "scripted-small", *, latency: float = 0.0):
        self.responder = responder or default_responder
        self.model = model
        self.latency = latency
        self.calls = 0  # times complete() ran: tests assert replay never increments it

    def complete(self, messages: list[dict], *, model: str, tools: list[dict] | None = None,
                 **params: Any) -> dict:
        self.calls += 1
        if self.latency:
            time.sleep(self.latency)
        reply = self.responder(messages, tools, {**params, "model": model})
        if isinstance(reply, str):
            reply = {"content": reply}
        calls = [{"id": c.get("id") or f"call_{i}", "name": c["name"], "arguments": c.get("arguments") or {}}
                 for i, c in enumerate(reply.get("tool_calls") or [])]
        content = reply.get("content") or ""
        prompt_text = json.dumps(messages) + (json.dumps(tools) if tools else "")
        return {
            "model": model,
            "content": content,
            "finish_reason": "tool_calls" if calls else "stop",
            "tool_calls": calls,
            "usage": {"prompt_tokens": approx_tokens(prompt_text),
                      "completion_tokens": approx_tokens(content + json.dumps(calls))},
        }


def default_client(responder: Responder | None = None, model: str = "scripted-small") -> ChatClient:
    """The real model when ``DURABLE_LLM_BASE_URL`` is set, else a ScriptedClient with ``responder``."""
    if os.environ.get("DURABLE_LLM_BASE_URL"):
        return OpenAIClient.from_env()
    return ScriptedClient(responder, model=model)
