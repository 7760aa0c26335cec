"""A Pydantic AI agent with two tools (one of them an effect) run as durable-ui workflows.

Every model request and every tool execution appends a line to $DURABLE_TEST_DIR/pai.log
*before* it does its work, so the tests can tell "ran twice" from "replayed".
PAI_KILL_AT_REQUEST=N SIGKILLs the worker process inside the N-th model request, once.
"""

import json
import os
import signal
from pathlib import Path

from asgiref.sync import async_to_sync
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

import journal
from journal.contrib.pydantic_ai import DurableAgent, idempotency_key


def _dir() -> Path:
    return Path(os.environ.get("DURABLE_TEST_DIR", "/tmp"))


def log(line: str) -> None:
    with open(_dir() / "pai.log", "a") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def executions() -> list[str]:
    path = _dir() / "pai.log"
    return path.read_text().splitlines() if path.exists() else []


def _returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]


def travel_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Request 1 looks the weather up, request 2 books, request 3 answers with what came back."""
    returns = _returns(messages)
    n = len(returns) + 1
    log(f"model {n}")
    if os.environ.get("PAI_KILL_AT_REQUEST") == str(n):
        marker = _dir() / f"pai-killed-at-{n}"
        if not marker.exists():
            marker.write_text("x")
            os.kill(os.getpid(), signal.SIGKILL)
    if n == 1:
        return ModelResponse(parts=[ToolCallPart("weather", {"city": "Oslo"}, tool_call_id="c1")])
    if n == 2:
        return ModelResponse(parts=[ToolCallPart("book_hotel", {"city": "Oslo", "nights": 2}, tool_call_id="c2")])
    return ModelResponse(parts=[TextPart(f"Done: {returns[0].content}; {returns[1].content}")])


async def travel_stream(messages: list[ModelMessage], info: AgentInfo):
    """The same answers as travel_model, streamed (for an event_stream_handler)."""
    response = travel_model(messages, info)
    for part in response.parts:
        if isinstance(part, ToolCallPart):
            yield {0: DeltaToolCall(name=part.tool_name, json_args=json.dumps(part.args),
                                    tool_call_id=part.tool_call_id)}
        else:
            words = part.content.split(" ")
            for i, word in enumerate(words):
                yield word if i == 0 else " " + word


travel_agent = Agent(FunctionModel(travel_model, stream_function=travel_stream), name="travel")


@travel_agent.tool_plain
def weather(city: str) -> str:
    log(f"tool weather {city}")
    return f"{city}: 3 degrees, snow"


@travel_agent.tool_plain
def book_hotel(city: str, nights: int) -> dict:
    key = idempotency_key()
    log(f"effect book_hotel {key}")
    return {"booked": city, "nights": nights, "confirmation": key}


durable_travel = DurableAgent(travel_agent, effects={"book_hotel": "needs_attention"})


@journal.workflow(name="pai_travel")
def travel(ctx, question: str) -> dict:
    result = durable_travel.run_sync(question)
    return {"output": result.output, "requests": result.usage.requests}


@journal.workflow(name="pai_travel_then_wait")
def travel_then_wait(ctx, question: str) -> dict:
    """The agent's loop, then a suspension: the resumed run re-executes from the top and replays it all."""
    result = durable_travel.run_sync(question)
    extra = ctx.wait_for_signal("go")
    return {"output": result.output, "extra": extra, "messages": len(result.all_messages())}


async def _plan(question: str) -> str:
    result = await durable_travel.run(question)
    return result.output


@journal.workflow(name="pai_travel_async")
def travel_async(ctx, question: str) -> str:
    return async_to_sync(_plan)(question)


STREAMED: list[str] = []


async def collect_events(run_ctx, events) -> None:
    async for event in events:
        STREAMED.append(type(event).__name__)


@journal.workflow(name="pai_travel_streamed")
def travel_streamed(ctx, question: str) -> str:
    result = durable_travel.run_sync(question, event_stream_handler=collect_events)
    ctx.wait_for_signal("go")
    return result.output
