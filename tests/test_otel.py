"""OpenTelemetry export: a run's recorded spans reach an exporter, as one trace whose id is the run id."""

from __future__ import annotations

import uuid

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import journal
from journal.integrations import otel
from journal.models import TraceSpan
from journal.primitives.llm_clients import ScriptedClient
from journal.store import writer

pytestmark = pytest.mark.django_db(transaction=True)


@journal.step()
def otel_add(a: int, b: int) -> int:
    return a + b


@journal.step()
def otel_boom() -> None:
    raise ValueError("no")


@journal.workflow(name="otel-sum")
def otel_sum(ctx, n: int) -> int:
    total = 0
    for i in range(n):
        total = otel_add(total, i)
    return total


@journal.workflow(name="otel-model")
def otel_model(ctx) -> str:
    client = ScriptedClient(model="scripted-small")
    return ctx.model(client, [{"role": "user", "content": "hello"}])["content"]


@journal.workflow(name="otel-fails")
def otel_fails(ctx) -> None:
    otel_boom()


@pytest.fixture
def exported():
    memory = InMemorySpanExporter()
    export = otel.install(memory)
    yield lambda: (export.provider.force_flush(), memory.get_finished_spans())[1]
    writer.SPAN_LISTENERS.remove(export)
    export.provider.shutdown()


def test_a_runs_spans_are_exported_as_one_trace_with_the_run_id(exported, drive):
    run_id = journal.start("otel-sum", 3)
    drive()
    assert journal.get_run(run_id).status == "completed"
    spans = exported()
    recorded = TraceSpan.objects.filter(run_id=run_id)
    assert len(spans) == recorded.count() == 3
    assert {s.context.trace_id for s in spans} == {uuid.UUID(run_id).int}
    assert sorted(s.attributes["durable.step"] for s in spans) == [1, 2, 3]
    assert {s.attributes["durable.span_id"] for s in spans} == set(recorded.values_list("span_id", flat=True))
    first = min(spans, key=lambda s: s.attributes["durable.step"])
    row = recorded.get(position=1)
    assert first.start_time == int(row.started_at.timestamp() * 1e9) and first.end_time >= first.start_time


def test_a_model_call_span_carries_the_genai_attributes(exported, drive):
    run_id = journal.start("otel-model")
    drive()
    run = journal.get_run(run_id)
    assert run.status == "completed"
    [span] = [s for s in exported() if s.context.trace_id == uuid.UUID(run_id).int]
    attrs = span.attributes
    assert attrs["gen_ai.request.model"] == "scripted-small" and attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.usage.input_tokens"] > 0 and attrs["gen_ai.usage.output_tokens"] > 0
    assert attrs["gen_ai.usage.input_tokens"] + attrs["gen_ai.usage.output_tokens"] == run.tokens


def test_a_failed_step_is_an_error_span(exported, drive):
    run_id = journal.start("otel-fails")
    drive()
    assert journal.get_run(run_id).status == "failed"
    [span] = [s for s in exported() if s.context.trace_id == uuid.UUID(run_id).int]
    assert span.status.status_code == StatusCode.ERROR and "ValueError" in span.status.description


def test_a_broken_exporter_never_fails_a_run(drive):
    def broken(run_id, spans):
        raise RuntimeError("collector down")

    writer.SPAN_LISTENERS.append(broken)
    try:
        run_id = journal.start("otel-sum", 2)
        drive()
    finally:
        writer.SPAN_LISTENERS.remove(broken)
    assert journal.get_run(run_id).status == "completed"


def test_an_endpoint_without_the_extra_says_which_extra_to_install(monkeypatch):
    import sys

    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    import journal.integrations

    monkeypatch.setitem(sys.modules, "journal.integrations.otel", None)  # as if the extra were not installed
    monkeypatch.delattr(journal.integrations, "otel")
    with pytest.raises(ImproperlyConfigured, match=r"durable-ui\[otel\]"):
        apps.get_app_config("journal").ready()
