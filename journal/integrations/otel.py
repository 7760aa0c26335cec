"""OpenTelemetry export of the trace: every span the engine records, sent to an OTLP collector too.

On when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set and the ``otel`` extra is
installed (``pip install durable-ui[otel]``); ``JournalConfig.ready`` installs it. The standard
``OTEL_*`` variables configure the exporter (headers, protocol, service name via
``OTEL_SERVICE_NAME``, default ``durable-ui``).

A run is one trace: its trace id is the run id (a UUID is 128 bits, as a trace id is), so a
collector groups a run's steps, model calls and tool calls, and the dashboard's run id finds it
there. Spans are exported after their rows commit, with their recorded start and end times; the
engine's own span id and the step position ride along as attributes. Telemetry never slows or
fails a journal write: spans go through a BatchSpanProcessor, and an exporter error is logged.
"""

from __future__ import annotations

import os
import uuid
from datetime import datetime

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags

from journal.store import writer

# The OpenTelemetry GenAI semantic conventions for what a model call's span records.
GEN_AI_ATTRIBUTES = {"model": "gen_ai.request.model", "tokens_in": "gen_ai.usage.input_tokens",
                     "tokens_out": "gen_ai.usage.output_tokens"}


def _ns(value: datetime) -> int:
    return int(value.timestamp() * 1_000_000_000)


def _root_span_id(run_id: uuid.UUID) -> int:
    return (run_id.int & 0xFFFF_FFFF_FFFF_FFFF) or 1  # a span id must not be 0


class SpanExport:
    """A span listener for the journal writer that re-creates each recorded span in OpenTelemetry."""

    def __init__(self, provider: TracerProvider):
        self.provider = provider
        self.tracer = provider.get_tracer("durable-ui")

    def __call__(self, run_id: uuid.UUID, spans: list[dict]) -> None:
        parent = SpanContext(trace_id=run_id.int, span_id=_root_span_id(run_id), is_remote=True,
                             trace_flags=TraceFlags(TraceFlags.SAMPLED))
        context = trace.set_span_in_context(NonRecordingSpan(parent))
        for recorded in spans:
            attributes = {"durable.run_id": str(run_id), "durable.span_id": recorded.get("span_id", ""),
                          "durable.kind": recorded.get("kind", ""), "durable.attempt": recorded.get("attempt", 1)}
            if recorded.get("position") is not None:
                attributes["durable.step"] = recorded["position"]
            for name, convention in GEN_AI_ATTRIBUTES.items():
                if recorded.get(name):
                    attributes[convention] = recorded[name]
            if recorded.get("kind") == "model":
                attributes["gen_ai.operation.name"] = "chat"
            if recorded.get("cost"):
                attributes["durable.cost"] = float(recorded["cost"])
            span = self.tracer.start_span(recorded.get("name", "step"), context=context, attributes=attributes,
                                          start_time=_ns(recorded["started_at"]))
            if recorded.get("status") == "error":
                span.set_status(Status(StatusCode.ERROR, recorded.get("error", "")[:500]))
            span.end(end_time=_ns(recorded["ended_at"]))


def install(exporter: SpanExporter | None = None) -> SpanExport:
    """Register the export with the journal writer (once); an OTLP/HTTP exporter unless one is given."""
    if exporter is None:
        exporter = OTLPSpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME",
                                                                                       "durable-ui")}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    export = SpanExport(provider)
    writer.SPAN_LISTENERS[:] = [lst for lst in writer.SPAN_LISTENERS if not isinstance(lst, SpanExport)]
    writer.SPAN_LISTENERS.append(export)
    return export
