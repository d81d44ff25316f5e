"""OpenTelemetry spans per call (``otel_traces``) on the real engine and broker, collected with the
SDK's in-memory exporter from an in-process ingress. Skipped only without the otel extra."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from ingress.app import create_app
from titoflow.settings import Settings

pytestmark = pytest.mark.engine
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
export = pytest.importorskip("opentelemetry.sdk.trace.export")


def span_exporter() -> Any:
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if not isinstance(provider, sdk_trace.TracerProvider):  # set once per process
        provider = sdk_trace.TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = in_memory.InMemorySpanExporter()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    return exporter


async def test_each_call_is_a_span_with_session_step_chain_engine_and_tokens(
    stack_settings: Settings,
) -> None:
    exporter = span_exporter()
    app = create_app(stack_settings.model_copy(update={"otel_traces": True}))
    session = f"otel-{uuid.uuid4().hex[:6]}"
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://ingress", timeout=120
        ) as client,
    ):
        answer = (await client.post(f"/sess/{session}/v1/chat/completions", json=chat)).json()
        generated = (
            await client.post(
                f"/sess/{session}/generate",
                json={"input_ids": [1, 2, 3], "sampling_params": {"max_tokens": 3}},
            )
        ).json()
        refused = await client.post(f"/sess/{session}/generate", json={"input_ids": [10**9]})
        overflow = await client.post(
            f"/sess/{session}/generate",
            json={"input_ids": [1] * (stack_settings.engine_max_model_len + 1)},
        )
    spans = [
        s
        for s in exporter.get_finished_spans()
        if s.attributes.get("titoflow.session_id") == session
    ]
    assert refused.status_code == 400 and overflow.status_code == 400
    assert [s.name for s in spans] == [
        "titoflow openai.chat",
        "titoflow generate",
        "titoflow generate",
    ]
    chat_span, generate_span, failed = spans
    assert (
        chat_span.attributes["gen_ai.usage.output_tokens"] == answer["usage"]["completion_tokens"]
    )
    assert chat_span.attributes["gen_ai.usage.input_tokens"] == answer["usage"]["prompt_tokens"]
    assert chat_span.attributes["titoflow.step_id"] == answer["id"].removeprefix("chatcmpl-")
    assert generate_span.attributes["titoflow.step_id"] == generated["step_id"]
    assert generate_span.attributes["titoflow.chain_id"] == generated["chain_id"]
    assert generate_span.attributes["gen_ai.usage.input_tokens"] == 3
    assert generate_span.attributes["gen_ai.usage.output_tokens"] == len(generated["token_ids"])
    for span in (chat_span, generate_span):
        assert span.attributes["titoflow.engine_url"] == stack_settings.engine_url
        assert span.status.is_ok
    assert not failed.status.is_ok and "titoflow.step_id" not in failed.attributes
