"""The SGLang backend's contract, pinned against SGLang's OWN DEFINITIONS from its published
package (tests/support/sglang_reference.py), since no SGLang server can run here:

- every request body titoflow sends is admitted by SGLang's generated JSON contract
  (``GenerateRequest.from_json_value``, the gate its server runs before a ``/generate``), and
  names only fields of the Python server's ``GenerateReqInput`` / ``SamplingParams``;
- responses built by SGLang's own encoders (``GenerateResponse.to_json_value``) parse into the
  right tokens, logprobs, finish reason and weight versions, and the ``meta_info`` keys the
  parser reads are keys SGLang's tokenizer manager writes;
- over HTTP, an SGLANG HTTP DOUBLE (a FastAPI app in this file that checks each request with the
  same contract and answers in the shapes above, cumulative or incremental streams) drives the
  streaming and non-streaming paths and the abort. It is a double: nothing here ran SGLang.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import replace
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from schemas.events import VersionSpan
from tests.support import sglang_reference
from tests.support.apps import serving
from titoflow.engine.api import GenerateParams
from titoflow.engine.sglang import SGLangEngine
from titoflow.errors import ContextOverflow, EngineError

VARIANTS = [
    GenerateParams(max_tokens=16, stop_token_ids=(151645,)),
    GenerateParams(max_tokens=8, temperature=0.7, top_p=0.9, seed=7, stop=("\n\n",)),
    GenerateParams(max_tokens=8, top_logprobs=3),
    GenerateParams(
        max_tokens=64,
        structured={"structured_outputs": {"structural_tag": json.dumps({"type": "x"})}},
    ),
]


@pytest.fixture(scope="module")
def api() -> ModuleType:
    return sglang_reference.api_types()


def class_fields(file: str, name: str) -> set[str]:
    """Annotated fields of a (data)class, or the parameters of its ``__init__``."""
    tree = ast.parse(sglang_reference.path(file).read_text())
    [node] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    fields = {
        s.target.id
        for s in node.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    }
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            fields |= {a.arg for a in item.args.args + item.args.kwonlyargs} - {"self"}
    return fields


def string_constants(file: str) -> Iterator[str | bytes]:
    for node in ast.walk(ast.parse(sglang_reference.path(file).read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
            yield node.value


def bodies() -> Iterator[dict[str, Any]]:
    dense, moe = SGLangEngine("http://sglang.invalid", 5.0), SGLangEngine("http://m", 5.0, 2)
    for params in VARIANTS:
        for stream in (False, True):
            yield dense.body([1, 2, 3], params, "step-1-abcd", "session-9", stream)
    yield moe.body([1, 2, 3], replace(VARIANTS[0], routed_experts_start=2), "r", "s", False)


def test_requests_pass_sglangs_own_contract_gate(api: ModuleType) -> None:
    generate_fields = class_fields("sglang/srt/managers/io_struct.py", "GenerateReqInput")
    sampling_fields = class_fields("sglang/srt/sampling/sampling_params.py", "SamplingParams")
    for body in bodies():
        decoded = api.GenerateRequest.from_json_value(body)  # raises JsonContractError if not
        assert decoded.input_ids == [1, 2, 3] and decoded.return_logprob is True
        # The gate ignores top-level keys it does not declare (return_routed_experts is one);
        # the Python server's dataclass must declare every one.
        assert set(body) <= generate_fields
        assert set(body["sampling_params"]) <= sampling_fields
    assert decoded.routed_experts_start_len == 2 and body["return_routed_experts"] is True
    assert {"rid", "routing_key"} <= set(api.GenerateRequest.__struct_fields__)
    # The gate can say no: vLLM's body is not SGLang's.
    vllm_style = {"token_ids": [1], "sampling_params": {"max_tokens": 4, "logprobs": 0}}
    with pytest.raises(api.JsonContractError, match="unknown field `max_tokens`"):
        api.GenerateRequest.from_json_value(vllm_style)
    # Abort by rid, on the route SGLang's HTTP server serves.
    assert api.AbortRequest.from_json_value({"rid": "step-1-abcd"}).rid == "step-1-abcd"
    assert "/abort_request" in set(string_constants("sglang/srt/entrypoints/http_server.py"))


def test_forced_tool_calls_travel_as_sglangs_structural_tag(api: ModuleType) -> None:
    [body] = [b for b in bodies() if "structural_tag" in b["sampling_params"]][:1]
    decoded = api.SamplingParams.from_json_value(body["sampling_params"])
    assert json.loads(decoded.structural_tag) == {"type": "x"}
    engine = SGLangEngine("http://sglang.invalid", 5.0)
    with pytest.raises(EngineError, match="no SGLang form"):
        engine.body(
            [1], GenerateParams(max_tokens=1, structured={"guided_json": {}}), "r", "", False
        )


def sglang_response(
    api: ModuleType,
    ids: list[int],
    logprobs: list[float],
    total: int,
    finish: Any = None,
    spans: list[tuple[str, int, int]] = (),  # type: ignore[assignment]
    top: list[list[tuple[float, int]]] | None = None,
) -> dict[str, Any]:
    """A /generate answer as SGLang's own encoder writes it."""
    meta = api.GenerateMetaInfo(
        id="step-1-abcd",
        prompt_tokens=3,
        completion_tokens=total,
        finish_reason=finish,
        output_token_logprobs=[
            api.LogprobEntry(logprob=lp, token_id=t) for t, lp in zip(ids, logprobs, strict=True)
        ],
        output_top_logprobs=[
            [api.LogprobEntry(logprob=lp, token_id=t) for lp, t in row] for row in top or []
        ],
        weight_version=spans[-1][0] if spans else "default",
        weight_versions=[api.WeightVersionSpan(version=v, start=s, end=e) for v, s, e in spans],
    )
    encoded: dict[str, Any] = api.GenerateResponse(
        text="…", output_ids=ids, meta_info=meta
    ).to_json_value()
    return encoded


def test_responses_from_sglangs_encoder_parse_exactly(api: ModuleType) -> None:
    engine = SGLangEngine("http://sglang.invalid", 5.0)
    payload = sglang_response(
        api,
        [11, 12, 151645],
        [-0.5, -1.25, -0.125],
        3,
        api.FinishStop(matched=151645),
        [("v1", 0, 2), ("v2", 2, 3)],
        top=[[(-0.5, 11), (-2.0, 99)], [(-1.25, 12)], [(-0.125, 151645)]],
    )
    chunk = engine.chunk(payload, 0, 3)
    assert (chunk.token_ids, chunk.logprobs) == ([11, 12, 151645], [-0.5, -1.25, -0.125])
    assert (chunk.finish_reason, chunk.stop_reason) == ("stop", 151645)
    assert chunk.weight_versions == [
        VersionSpan(version="v1", start=0, end=2),
        VersionSpan(version="v2", start=2, end=3),
    ]
    assert chunk.top_logprobs[0] == [(11, -0.5), (99, -2.0)]
    length = sglang_response(api, [5], [-1.0], 1, api.FinishLength(length=1))
    assert engine.chunk(length, 0, 3).finish_reason == "length"
    # An older server without spans: its one version covers the whole output.
    no_spans = sglang_response(api, [5, 6], [-1.0, -2.0], 2, api.FinishLength(length=2))
    assert engine.chunk(no_spans, 0, 3).weight_versions == [
        VersionSpan(version="default", start=0, end=2)
    ]
    # Ids and logprobs that disagree are an engine error, never a guess.
    bad = sglang_response(api, [5, 6], [-1.0, -2.0], 2, api.FinishLength(length=2))
    bad["output_ids"] = [5, 7]
    with pytest.raises(EngineError, match="other tokens"):
        engine.chunk(bad, 0, 3)


def test_routed_experts_as_sglang_encodes_them(api: ModuleType) -> None:
    # SGLang: base64 of the int32 [rows, layers, top_k] tensor's bytes, rows for positions
    # [routed_experts_start_len, prompt + completion - 1) (state_capturer/routed_experts.py).
    engine = SGLangEngine("http://sglang.invalid", 5.0, experts_per_token=2)
    payload = sglang_response(api, [11, 12, 13], [-1.0] * 3, 3, api.FinishLength(length=3))
    ids = np.arange(4 * 3 * 2, dtype=np.int32).reshape(4, 3, 2)  # 3 prompt + 3 - 1 - start 1
    payload["meta_info"]["routed_experts"] = base64.b64encode(ids.tobytes()).decode()
    routed = engine.chunk(payload, 0, prompt_len=3, experts_start=1).routed_experts
    assert routed is not None and (routed.start, routed.shape) == (1, (4, 3, 2))
    assert (routed.to_numpy() == ids).all()
    payload["meta_info"]["routed_experts"] = base64.b64encode(ids[:3].tobytes()).decode()
    with pytest.raises(EngineError, match="routed expert ids"):
        engine.chunk(payload, 0, prompt_len=3, experts_start=1)


def test_the_parser_reads_keys_sglang_writes(api: ModuleType) -> None:
    written = set(string_constants("sglang/srt/managers/tokenizer_manager.py"))
    written |= set(string_constants("sglang/srt/utils/weight_versions.py"))
    read = {
        "meta_info",
        "output_ids",
        "completion_tokens",
        "output_token_logprobs",
        "output_top_logprobs",
        "finish_reason",
        "weight_version",
        "weight_versions",
    }
    assert read <= written
    assert read - {"meta_info", "output_ids"} <= set(api.GenerateMetaInfo.__struct_fields__)
    assert "routed_experts" in written  # not declared by the contract: the Python server's own
    framing = set(string_constants("sglang/srt/entrypoints/http_server.py"))
    assert {b"data: ", b"data: [DONE]\n\n"} <= framing


class SGLangDouble:
    """SGLANG HTTP DOUBLE: checks each request with SGLang's contract, answers five tokens in
    SGLang's shapes; streams cumulatively (SGLang's default) or incrementally."""

    def __init__(self, api: ModuleType, incremental: bool) -> None:
        self.api, self.incremental = api, incremental
        self.aborted: list[str] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.app = FastAPI()
        self.app.post("/generate")(self.generate)
        self.app.post("/abort_request")(self.abort)

    async def generate(self, request: Request) -> Response:
        body = await request.json()
        self.api.GenerateRequest.from_json_value(body)
        if len(body["input_ids"]) > 100:
            message = "The input (101 tokens) is longer than the model's context length (100)."
            return JSONResponse({"error": {"message": message}}, status_code=400)
        ids = [100 + i for i in range(5)]
        logprobs = [-0.25 * (i + 1) for i in range(5)]
        spans = [("v1", 0, 5)]
        if not body["stream"]:
            finish = self.api.FinishLength(length=5)
            return JSONResponse(sglang_response(self.api, ids, logprobs, 5, finish, spans))

        async def events() -> AsyncIterator[bytes]:
            for n in range(1, 6):
                start = n - 1 if self.incremental else 0
                finish = self.api.FinishLength(length=5) if n == 5 else None
                payload = sglang_response(
                    self.api, ids[start:n], logprobs[start:n], n, finish, spans[: n // 5]
                )
                yield b"data: " + json.dumps(payload).encode() + b"\n\n"
                if n == 2:
                    await self.hold.wait()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def abort(self, request: Request) -> Response:
        self.aborted.append(self.api.AbortRequest.from_json_value(await request.json()).rid)
        return Response(status_code=200)


@pytest.mark.parametrize("incremental", [False, True])
async def test_http_double_streaming_and_not(api: ModuleType, incremental: bool) -> None:
    double = SGLangDouble(api, incremental)
    params = GenerateParams(max_tokens=5, seed=3)
    async with serving(double.app) as url:
        engine = SGLangEngine(url, 30.0)
        try:
            whole = await engine.generate([1, 2], params, "req-1", session_id="s")
            chunks = [c async for c in engine.generate_stream([1, 2], params, "req-2", "s")]
            with pytest.raises(ContextOverflow):
                await engine.generate(list(range(101)), params, "req-3")
            double.hold.clear()  # a reader that leaves mid-stream aborts its request
            stream = engine.generate_stream([1, 2], params, "req-4", "s")
            assert isinstance(stream, AsyncGenerator)
            await anext(stream)
            await stream.aclose()
            double.hold.set()
        finally:
            await engine.close()
    assert whole.token_ids == [100, 101, 102, 103, 104] and whole.engine_url == url
    assert whole.logprobs == [-0.25, -0.5, -0.75, -1.0, -1.25]
    assert whole.finish_reason == "length"
    assert whole.weight_versions == [VersionSpan(version="v1", start=0, end=5)]
    assert [c.token_ids for c in chunks] == [[100], [101], [102], [103], [104]]
    assert [lp for c in chunks for lp in c.logprobs] == whole.logprobs
    assert chunks[-1].finish_reason == "length" and chunks[-1].weight_versions
    assert double.aborted == ["req-4"]
