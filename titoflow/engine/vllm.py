"""vLLM's token-in/token-out client, an :class:`~titoflow.engine.api.Engine`.

vLLM: ``POST /inference/v1/generate`` (served with ``--enable-scale-out``) takes ``token_ids``
and ``sampling_params`` and returns the sampled ``token_ids`` with per-token logprobs and the
``weight_versions`` spans that sampled them; with ``stream`` it sends one SSE event per engine
step carrying only the new tokens. Ids come from the engine, never from re-encoding text.
A server started with ``--enable-return-routed-experts`` (MoE) also returns ``routed_experts``
(base64 ``.npy``, rows for positions ``[routed_experts_prompt_start, prompt + completion - 1)``,
on the last stream event only); it becomes :class:`~schemas.routed_experts.RoutedExperts` here.
A prompt with images is sent with one placeholder per image and the images as ``content_parts``,
and the engine's expansion must give back the prompt's ids (titoflow/engine/image_expansion.py).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import socket
from array import array
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import httpx
import numpy as np
import orjson

from schemas.events import VersionSpan
from schemas.routed_experts import NUMPY_DTYPE, RoutedExperts
from titoflow.engine.api import (
    GenerateParams,
    Generation,
    GenerationChunk,
    PromptScores,
)
from titoflow.engine.http1 import Http1Client
from titoflow.engine.image_expansion import check_expansion, content_parts, engine_prompt
from titoflow.errors import ContextOverflow, EngineError, EngineUnavailable
from titoflow.tito.shared_tokens import SharedTokens

# What an unreachable, reset or silent engine raises (titoflow/engine/http1.py; timeouts included).
_TRANSPORT_ERRORS = (OSError, TimeoutError)


def _json_ids(ids: Sequence[int]) -> Any:
    """Token ids as orjson writes them fastest: a chain's int32 ids as a numpy view, written
    from memory. A list makes every id a Python int first, most of the serializing time and a
    cost growing with the history TITO never re-renders (docs/benchmarks.md §1–2)."""
    if isinstance(ids, SharedTokens):
        return np.frombuffer(ids.view(), dtype=np.int32)
    if isinstance(ids, array) and ids.itemsize == 4 and ids.typecode in "il":
        return np.frombuffer(ids, dtype=np.int32)
    return list(ids)


def _dumps(body: dict[str, Any]) -> bytes:
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


_PROBE_TIMEOUT_S = 2.0
_CONTROL_TIMEOUT_S = 30.0


def nodelay_transport() -> httpx.AsyncHTTPTransport:
    # Small request/response pairs on keep-alive connections stall on Nagle + delayed ACK.
    return httpx.AsyncHTTPTransport(
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)], retries=0
    )


class VLLMEngine:
    """vLLM over titoflow/engine/http1.py: a call costs a quarter of httpx's CPU and under half of
    aiohttp's (against the engine double), and that call is most of what a proxy adds per turn.
    Keep-alive connections without a limit (the pool bounds calls)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        # Per read for a stream: a long one is fine as long as the engine keeps sending.
        self._timeout_s = timeout_s
        self._http = Http1Client(self.url)

    def _body(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        stream: bool,
        resend: bool = False,
    ) -> bytes:
        """The generate request's JSON, serialized here: the numpy view of a chain's ids it
        takes is not held past this call (a store appends in place only while no view of it
        is out)."""
        sampling: dict[str, Any] = {
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": params.top_logprobs,  # 0: just the sampled token's own logprob
            "stop_token_ids": list(params.stop_token_ids),
            **params.optional_sampling(seed_key="seed"),
        }
        if params.routed_experts_start:
            sampling["routed_experts_prompt_start"] = params.routed_experts_start
        sampling.update(params.structured or {})
        body = {
            "request_id": request_id,
            "token_ids": _json_ids(prompt_ids),
            "sampling_params": sampling,
            "stream": stream,
        }
        if params.images:
            body["token_ids"] = engine_prompt(prompt_ids, params.images)
            body["content_parts"] = content_parts(params.images, resend)
            body["return_token_ids"] = True  # the expanded prompt, to check against ours
        return _dumps(body)

    async def _post_generate(self, body: bytes) -> Any:
        try:
            response = await self._http.request(
                "POST", "/inference/v1/generate", body, timeout_s=self._timeout_s
            )
        except _TRANSPORT_ERRORS as exc:
            raise EngineUnavailable(f"engine {self.url} unreachable: {exc!r}") from exc
        if response.status != 200:
            raise engine_failure(response.status, response.body.decode(errors="replace"))
        return orjson.loads(response.body)

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> Generation:
        body = self._body(prompt_ids, params, request_id, stream=False)
        try:
            payload = await self._post_generate(body)
        except EngineError as exc:
            if not _lost_cached_image(exc, params):
                raise
            body = self._body(prompt_ids, params, request_id, stream=False, resend=True)
            payload = await self._post_generate(body)
        if params.images:
            expanded = payload.get("prompt_token_ids")
            check_expansion(prompt_ids, params.images, expanded, payload.get("mm_placeholders"))
        chunk = self._chunk(payload, len(prompt_ids), 0)
        return Generation.whole(chunk, str(payload.get("request_id", request_id)), self.url)

    async def generate_stream(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> AsyncIterator[GenerationChunk]:
        started = False
        try:
            async for chunk in self._stream(prompt_ids, params, request_id, resend=False):
                started = True
                yield chunk
        except EngineError as exc:
            if started or not _lost_cached_image(exc, params):
                raise
            async for chunk in self._stream(prompt_ids, params, request_id, resend=True):
                yield chunk

    async def _stream(
        self, prompt_ids: Sequence[int], params: GenerateParams, request_id: str, resend: bool
    ) -> AsyncIterator[GenerationChunk]:
        body = self._body(prompt_ids, params, request_id, stream=True, resend=resend)
        sampled = 0
        unchecked = bool(params.images)  # the first event carries the expanded prompt
        try:
            async with self._http.stream(
                "POST", "/inference/v1/generate", body, read_timeout_s=self._timeout_s
            ) as (status, chunks):
                if status != 200:
                    text = b"".join([chunk async for chunk in chunks]).decode(errors="replace")
                    raise engine_failure(status, text)
                async for line in _lines(chunks):
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    payload = orjson.loads(line[len(b"data: ") :])
                    if "error" in payload:  # vLLM reports request errors inside a 200 stream
                        error = payload["error"]
                        raise engine_failure(int(error.get("code", 500)), json.dumps(error))
                    if unchecked:
                        expanded = payload.get("prompt_token_ids")
                        placeholders = payload.get("mm_placeholders")
                        check_expansion(prompt_ids, params.images, expanded, placeholders)
                        unchecked = False
                    if payload.get("choices"):
                        chunk = self._chunk(payload, len(prompt_ids), sampled)
                        sampled += len(chunk.token_ids)
                        yield chunk
        except _TRANSPORT_ERRORS as exc:
            raise EngineUnavailable(f"engine {self.url} unreachable: {exc!r}") from exc

    def _chunk(self, payload: dict[str, Any], prompt_len: int, sampled: int) -> GenerationChunk:
        """One response or stream event; ``sampled`` tokens came in earlier events."""
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
            # Rows end at the last token fed to the model: every token but the newest.
            routed = _routed_experts(
                choice.get("routed_experts"), prompt_len + sampled + len(token_ids) - 1
            )
        except (KeyError, IndexError, TypeError, ValueError, binascii.Error) as exc:
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
            routed,
        )

    async def prompt_logprobs(self, token_ids: list[int], request_id: str) -> PromptScores:
        """The engine's logprob of every token of ``token_ids`` given the ones before it (None
        for the first), and the weight version that computed them. The prefix cache is
        bypassed explicitly: cached blocks return no prompt logprobs (vllm #42019)."""
        body = {
            "request_id": request_id,
            "token_ids": token_ids,
            "sampling_params": {
                "max_tokens": 1,
                "temperature": 1.0,
                "prompt_logprobs": 0,
                "skip_reading_prefix_cache": True,
            },
        }
        payload = await self._post_generate(_dumps(body))
        try:
            entries = payload["prompt_logprobs"]
            logprobs = [
                None if entry is None else float(entry[str(token)]["logprob"])
                for token, entry in zip(token_ids, entries, strict=True)
            ]
            spans = payload["choices"][0].get("weight_versions") or []
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EngineError(f"unexpected prompt logprobs from {self.url}: {exc!r}") from exc
        return PromptScores(logprobs, str(spans[0]["version"]) if spans else None)

    async def healthy(self) -> bool:
        try:
            response = await self._http.request("GET", "/health", timeout_s=_PROBE_TIMEOUT_S)
        except _TRANSPORT_ERRORS:
            return False
        return response.status == 200

    async def close(self) -> None:
        await self._http.close()

    # The RL routes (served with VLLM_SERVER_DEV_MODE=1). Pausing twice, resuming a running
    # engine and setting the current version again are harmless, so replicas may repeat them.
    async def pause(self, mode: Literal["keep", "abort"]) -> None:
        await self._control("POST", "/pause", query={"mode": mode})

    async def resume(self) -> None:
        await self._control("POST", "/resume")

    async def is_paused(self) -> bool:
        return bool((await self._control("GET", "/is_paused"))["is_paused"])

    async def set_weight_version(self, version: str) -> None:
        await self._control("POST", "/update_weight_version", {"new_version": version})

    async def weight_version(self) -> str:
        return str((await self._control("GET", "/weight_info"))["weight_version"])

    async def _control(
        self,
        method: str,
        path: str,
        json_body: dict[str, Any] | None = None,
        query: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        try:
            response = await self._http.request(
                method,
                path,
                None if json_body is None else orjson.dumps(json_body),
                timeout_s=_CONTROL_TIMEOUT_S,
                query=query,
            )
        except _TRANSPORT_ERRORS as exc:
            raise EngineUnavailable(f"engine {self.url} unreachable: {exc!r}") from exc
        if response.status != 200:
            text = response.body.decode(errors="replace")
            raise engine_failure(response.status, f"{method} {path}: {text}")
        body: dict[str, Any] = orjson.loads(response.body)
        return body


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The lines of a streamed body, however long (a last event carrying routed experts can be
    megabytes)."""
    buffer = bytearray()
    async for data in chunks:
        buffer += data
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            yield bytes(buffer[start:end]).rstrip(b"\r")
            start = end + 1
        del buffer[:start]
    if buffer:
        yield bytes(buffer)


_EXPERT_DTYPES = {np.dtype(v).newbyteorder("<"): k for k, v in NUMPY_DTYPE.items()}


def _routed_experts(encoded: str | None, end: int) -> RoutedExperts | None:
    """vLLM's base64 ``.npy`` of ``[rows, layers, top_k]`` expert ids for positions ending at
    ``end`` → the internal block (little-endian, dtype kept: vLLM already picks the narrowest)."""
    if not encoded:
        return None
    rows = np.load(io.BytesIO(base64.b64decode(encoded, validate=True)), allow_pickle=False)
    dtype = _EXPERT_DTYPES.get(rows.dtype.newbyteorder("<"))
    if rows.ndim != 3 or dtype is None or len(rows) > end:
        raise ValueError(f"routed_experts of shape {rows.shape} {rows.dtype} for {end} positions")
    if not len(rows):
        return None
    data = rows.astype(NUMPY_DTYPE[dtype], copy=False).tobytes()
    return RoutedExperts(start=end - len(rows), shape=rows.shape, dtype=dtype, data=data)


def _lost_cached_image(exc: EngineError, params: GenerateParams) -> bool:
    """Whether the engine refused an image sent by uuid alone because it no longer caches it
    (restarted, evicted, or another engine of a pool): the call is sent again with every URL."""
    return any(image.by_uuid for image in params.images) and "Cache miss" in str(exc)


def engine_failure(status: int, text: str) -> Exception:
    """The typed error of a non-200 answer (vLLM's and SGLang's context-window texts)."""
    text = text[:2000]
    if status in (502, 503, 504):
        return EngineUnavailable(f"engine answered {status}: {text}")
    if status == 400 and ("maximum model length" in text or "context length" in text):
        return ContextOverflow(f"the prompt does not fit the model's context window: {text}")
    return EngineError(f"engine answered {status}: {text}")
