"""Optional OpenTelemetry spans: one per policy call, off by default (``TITOFLOW_OTEL_TRACES``).

The opentelemetry packages are an optional extra (``pip install 'titoflow[otel]'``) and are
imported only when tracing is on. Spans are started from the current context (so they nest
under an instrumented server's request span) but never made current themselves: a streamed
call's span lives across an async generator's yields, where attaching a context is unsafe.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from schemas.events import StepRecorded

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

TRACER_NAME = "titoflow.ingress"


class CallSpan:
    """What a call learns about itself while it runs; a no-op without a span."""

    def __init__(self, span: Span | None) -> None:
        self._span = span

    def recorded(self, step: StepRecorded, prompt_tokens: int) -> None:
        if self._span is None:
            return
        self._span.set_attributes(
            {
                "titoflow.step_id": step.step_id,
                "titoflow.chain_id": step.chain_id,
                "titoflow.prefix": step.prefix,
                "titoflow.engine_url": step.engine_url,
                "titoflow.finish_reason": step.finish_reason,
                "gen_ai.usage.input_tokens": prompt_tokens,
                "gen_ai.usage.output_tokens": len(step.completion_ids),
            }
        )


class CallTracer:
    def __init__(self, enabled: bool) -> None:
        self._tracer: Tracer | None = None
        if enabled:
            try:
                from opentelemetry import trace
            except ImportError as exc:
                raise RuntimeError(
                    "otel_traces needs the otel extra: pip install 'titoflow[otel]'"
                ) from exc
            self._tracer = trace.get_tracer(TRACER_NAME)

    @contextmanager
    def call(self, api: str, session_id: str) -> Iterator[CallSpan]:
        """A span around one call; an exception marks it failed and propagates."""
        if self._tracer is None:
            yield CallSpan(None)
            return
        from opentelemetry.trace import Status, StatusCode

        span = self._tracer.start_span(
            f"titoflow {api}", attributes={"titoflow.api": api, "titoflow.session_id": session_id}
        )
        try:
            yield CallSpan(span)
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            span.end()


def install_otlp_exporter() -> None:
    """Export spans over OTLP/HTTP (configured by the standard ``OTEL_EXPORTER_OTLP_*`` and
    ``OTEL_SERVICE_NAME`` variables), unless the process already set a tracer provider."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
