"""SGLang's native token API as an :class:`~titoflow.engine.api.Engine`.

``POST /generate`` takes ``input_ids``, ``sampling_params`` (``max_new_tokens``,
``sampling_seed``, ...), ``return_logprob`` and ``rid``, and answers ``output_ids`` with
``meta_info``: ``output_token_logprobs`` as ``[logprob, token_id, text]`` triples,
``finish_reason`` as ``{"type": "stop"|"length"|"abort", ...}``, ``completion_tokens``,
``weight_version`` and the ``weight_versions`` spans, and with ``return_routed_experts`` the
base64 int32 ``routed_experts`` of positions ``[routed_experts_start_len, prompt + completion -
1)``. A stream is SSE ``data:`` events ended by
``data: [DONE]``; each event carries either all tokens so far (the default) or only the new ones
(``--incremental-streaming-output``), so new tokens are taken as the last
``completion_tokens - seen`` of each event, which is right in both modes. Aborts go to
``POST /abort_request`` with the ``rid``.

No SGLang server runs on the machines this was written on: the shapes come from SGLang's own
definitions (its generated JSON contract ``sglang/api/v1/api_types.py`` and the tokenizer
manager), pinned by tests/titoflow/engine/test_sglang_contract.py; see docs/engine.md.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import numpy as np

from schemas.events import VersionSpan
from schemas.routed_experts import RoutedExperts
from titoflow.engine.api import GenerateParams, Generation, GenerationChunk, TopLogprobs
from titoflow.engine.vllm import engine_failure, nodelay_transport
from titoflow.errors import EngineError, EngineUnavailable


class SGLangEngine:
    def __init__(self, url: str, timeout_s: float, experts_per_token: int = 0) -> None:
        """``experts_per_token`` > 0 (a MoE policy's ``num_experts_per_tok``) asks for the
        routed experts of every request: SGLang sends them as bare int32s, so the row width
        must be known to split layers from experts."""
        self.url = url.rstrip("/")
        self.experts_per_token = experts_per_token
        self._client = httpx.AsyncClient(
            base_url=self.url,
            transport=nodelay_transport(),
            timeout=httpx.Timeout(timeout_s, connect=5.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )

    def body(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str,
        stream: bool,
    ) -> dict[str, Any]:
        if params.images:  # its image fields are not known here: never send a prompt without them
            raise EngineError(f"the SGLang backend ({self.url}) does not take images yet")
        sampling: dict[str, Any] = {
            "max_new_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop_token_ids": list(params.stop_token_ids),
            # The ids are the record: stop strings must not be cut from the text either.
            "no_stop_trim": True,
            "skip_special_tokens": False,
            **params.optional_sampling(seed_key="sampling_seed"),
        }
        if params.structured:
            sampling["structural_tag"] = _structural_tag(params.structured)
        body: dict[str, Any] = {
            "rid": request_id,
            "input_ids": list(prompt_ids),
            "sampling_params": sampling,
            "return_logprob": True,
            "logprob_start_len": -1,  # the sampled tokens' logprobs only, none of the prompt
            "stream": stream,
        }
        if params.top_logprobs:
            body["top_logprobs_num"] = params.top_logprobs
        if session_id:
            body["routing_key"] = session_id  # keeps a session on one data-parallel rank
        if self.experts_per_token:
            body["return_routed_experts"] = True
            body["routed_experts_start_len"] = params.routed_experts_start
        return body

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> Generation:
        body = self.body(prompt_ids, params, request_id, session_id, stream=False)
        try:
            response = await self._client.post("/generate", json=body)
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"engine {self.url} unreachable: {exc!r}") from exc
        except asyncio.CancelledError:  # the engine would go on generating for nobody
            await self.abort(request_id)
            raise
        if response.status_code != 200:
            raise engine_failure(response.status_code, response.text)
        chunk = self.chunk(response.json(), 0, len(prompt_ids), params.routed_experts_start)
        return Generation.whole(chunk, request_id, self.url)

    async def generate_stream(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> AsyncIterator[GenerationChunk]:
        body = self.body(prompt_ids, params, request_id, session_id, stream=True)
        seen = 0
        try:
            async with self._client.stream("POST", "/generate", json=body) as response:
                if response.status_code != 200:
                    raise engine_failure(response.status_code, (await response.aread()).decode())
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    payload = json.loads(line[len("data: ") :])
                    chunk = self.chunk(payload, seen, len(prompt_ids), params.routed_experts_start)
                    seen += len(chunk.token_ids)
                    yield chunk
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"engine {self.url} unreachable: {exc!r}") from exc
        except (GeneratorExit, asyncio.CancelledError):  # the reader left before the end
            await self.abort(request_id)
            raise

    def chunk(
        self, payload: dict[str, Any], seen: int, prompt_len: int, experts_start: int = 0
    ) -> GenerationChunk:
        """The tokens of ``payload`` past the first ``seen`` (see the module docstring)."""
        if "error" in payload:  # errors inside a 200 stream
            error = payload["error"] or {}
            raise engine_failure(int(error.get("code") or 500), json.dumps(error))
        try:
            meta = payload["meta_info"]
            new = int(meta["completion_tokens"]) - seen
            output_ids = payload["output_ids"]
            entries = meta.get("output_token_logprobs") or []
            if new < 0 or len(output_ids) < new or len(entries) < new:
                raise ValueError(
                    f"{new} new tokens but {len(output_ids)} ids, {len(entries)} logprobs"
                )
            fresh = output_ids[len(output_ids) - new :]
            token_ids = [int(t) for t in fresh]
            logprob_entries = entries[len(entries) - new :]
            logprobs = [float(entry[0]) for entry in logprob_entries]
            if [int(entry[1]) for entry in logprob_entries] != token_ids:
                raise ValueError("output_token_logprobs name other tokens than output_ids")
            top_rows = meta.get("output_top_logprobs") or []
            top: TopLogprobs = [
                [(int(alt[1]), float(alt[0])) for alt in row or []]
                for row in top_rows[len(top_rows) - new :]
            ]
            finish = meta.get("finish_reason")
            spans = [VersionSpan(**span) for span in meta.get("weight_versions") or []]
            if not spans and meta.get("weight_version") is not None and finish:
                # Servers before the spans: the version at the end covers the whole output.
                total = seen + new
                spans = [VersionSpan(version=str(meta["weight_version"]), start=0, end=total)]
            # Rows end at the last token fed to the model: every token but the newest.
            end = prompt_len + seen + new - 1
            routed = self._routed_experts(meta.get("routed_experts"), experts_start, end)
        except (KeyError, IndexError, TypeError, ValueError, binascii.Error) as exc:
            raise EngineError(f"unexpected generate response from {self.url}: {exc!r}") from exc
        return GenerationChunk(
            token_ids=token_ids,
            logprobs=logprobs,
            top_logprobs=top,
            finish_reason=finish["type"] if finish else None,
            weight_versions=spans,
            stop_reason=_stop_reason(finish.get("matched")) if finish else None,
            engine_url=self.url,
            routed_experts=routed,
        )

    def _routed_experts(self, encoded: str | None, start: int, end: int) -> RoutedExperts | None:
        """SGLang's base64 int32 ``[rows, layers, top_k]`` for positions ``[start, end)``."""
        if not encoded or not self.experts_per_token:
            return None
        ids = np.frombuffer(base64.b64decode(encoded, validate=True), dtype="<i4")
        rows, width = end - start, self.experts_per_token
        if rows <= 0 or len(ids) % (rows * width):
            raise ValueError(f"{len(ids)} routed expert ids for {rows} positions × {width}")
        shape = (rows, len(ids) // (rows * width), width)
        return RoutedExperts(start=start, shape=shape, dtype="int32", data=ids.tobytes())

    async def abort(self, request_id: str) -> None:
        """Best effort: a request already finished or unknown is not an error."""
        with contextlib.suppress(httpx.HTTPError):
            await self._client.post("/abort_request", json={"rid": request_id}, timeout=5.0)

    async def healthy(self) -> bool:
        try:
            return (await self._client.get("/health", timeout=2.0)).status_code == 200
        except httpx.HTTPError:
            return False

    async def close(self) -> None:
        await self._client.aclose()


def _stop_reason(matched: Any) -> int | str | None:
    """A matched stop token id or string; SGLang may also name a token sequence (a list)."""
    return matched if isinstance(matched, int | str) else None


def _structural_tag(structured: dict[str, Any]) -> str:
    """vLLM's ``structured_outputs.structural_tag`` (what ingress/constraints.py builds) is
    the same xgrammar structural-tag text SGLang takes as ``sampling_params.structural_tag``."""
    tag = (structured.get("structured_outputs") or {}).get("structural_tag")
    if not isinstance(tag, str) or set(structured) != {"structured_outputs"}:
        raise EngineError(f"constrained decoding {sorted(structured)} has no SGLang form")
    return tag
