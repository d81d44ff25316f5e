"""Token-in/token-out engine clients. The ingress and workers see only :class:`Engine`.

vLLM: ``POST /inference/v1/generate`` (served with ``--enable-scale-out``) takes ``token_ids``
and ``sampling_params`` and returns the sampled ``token_ids`` with per-token logprobs and the
``weight_versions`` spans that sampled them; with ``stream`` it sends one SSE event per engine
step carrying only the new tokens. Ids come from the engine, never from re-encoding text.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from schemas.events import VersionSpan
from titoflow.errors import ContextOverflow, EngineError, EngineUnavailable

TopLogprobs = list[list[tuple[int, float]]]


@dataclass(frozen=True)
class GenerateParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0
    structured: dict[str, Any] | None = None  # extra sampling params of constrained decoding


@dataclass(frozen=True)
class GenerationChunk:
    """New tokens of a streamed generation; the last chunk has ``finish_reason``."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: TopLogprobs
    finish_reason: str | None = None
    weight_versions: list[VersionSpan] = field(default_factory=list)
    stop_reason: int | str | None = None  # the stop string or token id that ended it
    engine_url: str = ""  # the engine that sampled these tokens


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    request_id: str
    engine_url: str
    weight_versions: list[VersionSpan] = field(default_factory=list)
    top_logprobs: TopLogprobs = field(default_factory=list)
    stop_reason: int | str | None = None  # the stop string or token id that ended it


class Engine(Protocol):
    """One engine, or a pool of them (titoflow/engine_pool.py). ``session_id`` is the routing
    key: a pool keeps a session on one engine (its prefix cache); SGLang passes it on as its
    own ``routing_key``; vLLM ignores it."""

    url: str

    async def generate(
        self, prompt_ids: list[int], params: GenerateParams, request_id: str, session_id: str = ""
    ) -> Generation: ...

    def generate_stream(
        self, prompt_ids: list[int], params: GenerateParams, request_id: str, session_id: str = ""
    ) -> AsyncIterator[GenerationChunk]: ...

    async def healthy(self) -> bool: ...

    async def close(self) -> None: ...


def nodelay_transport() -> httpx.AsyncHTTPTransport:
    # Small request/response pairs on keep-alive connections stall on Nagle + delayed ACK.
    return httpx.AsyncHTTPTransport(
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)], retries=0
    )


class VLLMEngine:
    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.AsyncClient(
            base_url=self.url,
            transport=nodelay_transport(),
            timeout=httpx.Timeout(timeout_s, connect=5.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )

    def _body(
        self, prompt_ids: list[int], params: GenerateParams, request_id: str, stream: bool
    ) -> dict[str, Any]:
        sampling: dict[str, Any] = {
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": params.top_logprobs,  # 0: just the sampled token's own logprob
            "stop_token_ids": list(params.stop_token_ids),
        }
        if params.seed is not None:
            sampling["seed"] = params.seed
        if params.stop:
            sampling["stop"] = list(params.stop)
        sampling.update(params.structured or {})
        return {
            "request_id": request_id,
            "token_ids": prompt_ids,
            "sampling_params": sampling,
            "stream": stream,
        }

    async def generate(
        self, prompt_ids: list[int], params: GenerateParams, request_id: str, session_id: str = ""
    ) -> Generation:
        body = self._body(prompt_ids, params, request_id, stream=False)
        try:
            response = await self._client.post("/inference/v1/generate", json=body)
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"engine {self.url} unreachable: {exc!r}") from exc
        if response.status_code != 200:
            raise engine_failure(response.status_code, response.text)
        payload = response.json()
        chunk = self._chunk(payload)
        return Generation(
            token_ids=chunk.token_ids,
            logprobs=chunk.logprobs,
            finish_reason=chunk.finish_reason or "stop",
            request_id=str(payload.get("request_id", request_id)),
            engine_url=self.url,
            weight_versions=chunk.weight_versions,
            top_logprobs=chunk.top_logprobs,
            stop_reason=chunk.stop_reason,
        )

    async def generate_stream(
        self, prompt_ids: list[int], params: GenerateParams, request_id: str, session_id: str = ""
    ) -> AsyncIterator[GenerationChunk]:
        body = self._body(prompt_ids, params, request_id, stream=True)
        try:
            async with self._client.stream("POST", "/inference/v1/generate", json=body) as response:
                if response.status_code != 200:
                    raise engine_failure(response.status_code, (await response.aread()).decode())
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    payload = json.loads(line[len("data: ") :])
                    if "error" in payload:  # vLLM reports request errors inside a 200 stream
                        error = payload["error"]
                        raise engine_failure(int(error.get("code", 500)), json.dumps(error))
                    if payload.get("choices"):
                        yield self._chunk(payload)
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"engine {self.url} unreachable: {exc!r}") from exc

    def _chunk(self, payload: dict[str, Any]) -> GenerationChunk:
        try:
            choice = payload["choices"][0]
            token_ids = [int(t) for t in choice.get("token_ids") or []]
            entries = (choice.get("logprobs") or {}).get("content") or []
            logprobs = [float(entry["logprob"]) for entry in entries]
            top = [
                [(int(alt["token_id"]), float(alt["logprob"])) for alt in entry["top_logprobs"]]
                for entry in entries
            ]
            spans = [VersionSpan(**span) for span in choice.get("weight_versions") or []]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EngineError(f"unexpected generate response from {self.url}: {exc!r}") from exc
        if len(logprobs) != len(token_ids):
            raise EngineError(
                f"engine returned {len(token_ids)} tokens but {len(logprobs)} logprobs"
            )
        return GenerationChunk(
            token_ids,
            logprobs,
            top,
            choice.get("finish_reason"),
            spans,
            choice.get("stop_reason"),
            self.url,
        )

    async def healthy(self) -> bool:
        try:
            return (await self._client.get("/health", timeout=2.0)).status_code == 200
        except httpx.HTTPError:
            return False

    async def close(self) -> None:
        await self._client.aclose()


def engine_failure(status: int, text: str) -> Exception:
    """The typed error of a non-200 answer (vLLM's and SGLang's context-window texts)."""
    text = text[:2000]
    if status in (502, 503, 504):
        return EngineUnavailable(f"engine answered {status}: {text}")
    if status == 400 and ("maximum model length" in text or "context length" in text):
        return ContextOverflow(f"the prompt does not fit the model's context window: {text}")
    return EngineError(f"engine answered {status}: {text}")
