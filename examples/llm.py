"""Which model the examples talk to: a real one when the environment points at it, else offline.

Set ``DURABLE_LLM_BASE_URL`` (and ``DURABLE_LLM_API_KEY``, ``DURABLE_LLM_MODEL``) to run the
examples against any OpenAI-compatible endpoint (a hosted API, vLLM, Ollama). Without it they
use a ``ScriptedClient`` whose responder imitates a model deterministically, so the demo and
the tests run with no network.
"""

from __future__ import annotations

import json
import re
from typing import Any

from journal.primitives.llm_clients import ChatClient, Responder, default_client


def client_for(responder: Responder, model: str = "scripted-small", *, pace: float = 0.0) -> ChatClient:
    """The configured model, or the offline one; ``pace`` slows the offline one (seconds per call) so a
    demo run stays visibly *running* for a while."""
    client = default_client(responder, model=model)
    if pace and hasattr(client, "latency"):
        client.latency = pace
    return client


def system_tag(messages: list[dict]) -> str:
    """The ``[tag]`` at the start of the system prompt: how the offline responders tell prompts apart."""
    for m in messages:
        if m.get("role") == "system":
            found = re.match(r"\s*\[([\w-]+)\]", str(m.get("content", "")))
            return found.group(1) if found else ""
    return ""


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in a model's reply (real models wrap JSON in prose or code fences)."""
    start = text.find("{")
    while start != -1:
        depth = 0
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    try:
                        value = json.loads(text[start:i + 1])
                    except ValueError:
                        break
                    return value if isinstance(value, dict) else None
        start = text.find("{", start + 1)
    return None


def demo_responder(messages: list[dict], tools: list[dict] | None, params: dict) -> dict | str:
    """One responder for every example, chosen by the system prompt's tag (for the local server)."""
    from examples import contracts, research

    tag = system_tag(messages)
    if tag.startswith("contract"):
        return contracts.responder(messages, tools, params)
    return research.responder(messages, tools, params)
