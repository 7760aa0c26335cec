"""Model clients: the OpenAI-compatible chat-completions protocol, and an offline scripted client.

Every client has ``model`` (its default model id) and ``complete(messages, *, model, tools, **params)``
returning one *normalised* response dict, whatever the wire looked like (plain JSON or an SSE
stream)::

    {"model": "gpt-4o-mini", "content": "text or ''", "finish_reason": "stop" | "tool_calls" | ...,
     "tool_calls": [{"id": "call_1", "name": "search", "arguments": {...}}],
     "usage": {"prompt_tokens": 12, "completion_tokens": 34}}

That dict is what ``ctx.model`` records in the journal, so replay returns exactly it. Clients do
no journaling themselves: they are plain I/O, safe to use outside a workflow.

The HTTP client uses only the standard library (``urllib``): one request per call, a timeout,
and retries with exponential backoff on 429 and 5xx that honour ``Retry-After``. Configure it
with ``DURABLE_LLM_BASE_URL`` (e.g. ``http://localhost:11434/v1`` for Ollama, a vLLM server, or
a hosted API), ``DURABLE_LLM_API_KEY`` and ``DURABLE_LLM_MODEL``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from journal.store.errors import DurableError

# USD per million tokens (input, output). Unknown models cost 0: the run still records tokens.
# Override or extend with DURABLE_LLM_PRICES='{"my-model": [0.2, 0.6]}'.
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-sonnet-4": (3.00, 15.00),
    "llama3.1:8b": (0.0, 0.0),
    "scripted-small": (0.15, 0.60),
    "scripted-large": (2.50, 10.00),
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
    table = dict(DEFAULT_PRICES)
    extra = os.environ.get("DURABLE_LLM_PRICES", "")
    if extra:
        try:
            for name, pair in json.loads(extra).items():
                table[name] = (float(pair[0]), float(pair[1]))
        except (ValueError, TypeError, IndexError, AttributeError) as exc:
            raise ModelError(f"DURABLE_LLM_PRICES must be JSON like {{\"model\": [in, out]}}: {exc}") from None
    return table


def cost_of(model: str, tokens_in: int, tokens_out: int, table: dict | None = None) -> float:
    """Cost in USD; a model id with a suffix ("gpt-4o-mini-2024-07-18") uses its longest known prefix."""
    table = table if table is not None else prices()
    price = table.get(model)
    if price is None:
        matches = [name for name in table if model.startswith(name)]
        price = table[max(matches, key=len)] if matches else (0.0, 0.0)
    return round((tokens_in * price[0] + tokens_out * price[1]) / 1_000_000, 6)


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


def aggregate_stream(lines: Iterable[bytes], model: str) -> dict:
    """Fold an SSE stream of chat-completion chunks into one normalised response."""
    content: list[str] = []
    calls: dict[int, dict] = {}
    finish = "stop"
    usage: dict = {}
    seen_model = model
    for raw in lines:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            raise ModelError(f"malformed stream chunk: {data[:200]}") from None
        seen_model = chunk.get("model") or seen_model
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(int(tc.get("index", 0)), {"id": "", "function": {"name": "", "arguments": ""}})
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


class OpenAIClient:
    """A client for any server speaking OpenAI's ``POST {base_url}/chat/completions``."""

    def __init__(self, base_url: str, api_key: str = "", model: str = "gpt-4o-mini", *, timeout: float = 60.0,
                 max_retries: int = 4, backoff: float = 0.5, max_backoff: float = 20.0, stream: bool = False,
                 sleep: Callable[[float], None] = time.sleep):
        if not base_url.startswith(("http://", "https://")):
            raise ModelError(f"the model base URL must start with http:// or https://, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.stream = stream
        self._sleep = sleep
        self.requests = 0  # HTTP requests sent (including retries)

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

    def complete(self, messages: list[dict], *, model: str, tools: list[dict] | None = None,
                 **params: Any) -> dict:
        stream = bool(params.pop("stream", self.stream))
        body: dict[str, Any] = {"model": model, "messages": messages, **params}
        if tools:
            body["tools"] = tools
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream" if stream else "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        attempt = 0
        while True:
            attempt += 1
            self.requests += 1
            request = urllib.request.Request(f"{self.base_url}/chat/completions", data=data, headers=headers,
                                             method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 (scheme checked)
                    if stream:
                        return aggregate_stream(response, model)
                    return normalise(json.loads(response.read()), model)
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:500].decode("utf-8", "replace")
                retryable = exc.code == 429 or exc.code >= 500
                if not retryable or attempt > self.max_retries:
                    raise ModelError(f"model endpoint answered {exc.code}: {detail}", status=exc.code) from None
                self._sleep(self._delay(attempt, exc.headers.get("Retry-After")))
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                if attempt > self.max_retries:
                    raise ModelError(f"model endpoint unreachable at {self.base_url}: {exc}") from None
                self._sleep(self._delay(attempt, None))

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            try:
                return min(max(float(retry_after), 0.0), self.max_backoff)
            except ValueError:
                pass  # an HTTP date: fall back to our own backoff
        return min(self.backoff * (2 ** (attempt - 1)), self.max_backoff) * (0.5 + random.random() / 2)


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
