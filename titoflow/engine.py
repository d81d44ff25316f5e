"""Token-in/token-out engine clients. The ingress and workers see only :class:`Engine`.

vLLM: ``POST /inference/v1/generate`` (served with ``--enable-scale-out``) takes ``token_ids``
and ``sampling_params`` and returns the sampled ``token_ids`` with per-token logprobs and the
``weight_versions`` spans that sampled them. Ids come from the engine, never from re-encoding.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from schemas.events import VersionSpan
from titoflow.errors import ContextOverflow, EngineError, EngineUnavailable


@dataclass(frozen=True)
class GenerateParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    request_id: str
    engine_url: str
    weight_versions: list[VersionSpan] = field(default_factory=list)


class Engine(Protocol):
    url: str

    async def generate(
        self, prompt_ids: list[int], params: GenerateParams, request_id: str
    ) -> Generation: ...

    async def healthy(self) -> bool: ...

    async def close(self) -> None: ...


def _nodelay_transport() -> httpx.AsyncHTTPTransport:
    # Small request/response pairs on keep-alive connections stall on Nagle + delayed ACK.
    return httpx.AsyncHTTPTransport(
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)], retries=0
    )


class VLLMEngine:
    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.AsyncClient(
            base_url=self.url,
            transport=_nodelay_transport(),
            timeout=httpx.Timeout(timeout_s, connect=5.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )

    async def generate(
        self, prompt_ids: list[int], params: GenerateParams, request_id: str
    ) -> Generation:
        sampling: dict[str, Any] = {
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 0,  # the sampled token's own logprob, no alternatives
            "stop_token_ids": list(params.stop_token_ids),
        }
        if params.seed is not None:
            sampling["seed"] = params.seed
        body = {"request_id": request_id, "token_ids": prompt_ids, "sampling_params": sampling}
        try:
            response = await self._client.post("/inference/v1/generate", json=body)
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"engine {self.url} unreachable: {exc!r}") from exc
        if response.status_code != 200:
            raise _engine_failure(response)
        return self._parse(response.json(), request_id)

    def _parse(self, payload: dict[str, Any], request_id: str) -> Generation:
        try:
            choice = payload["choices"][0]
            token_ids = [int(t) for t in choice["token_ids"]]
            entries = (choice.get("logprobs") or {}).get("content") or []
            logprobs = [float(entry["logprob"]) for entry in entries]
            spans = [VersionSpan(**span) for span in choice.get("weight_versions") or []]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EngineError(f"unexpected generate response from {self.url}: {exc!r}") from exc
        if len(logprobs) != len(token_ids):
            raise EngineError(
                f"engine returned {len(token_ids)} tokens but {len(logprobs)} logprobs"
            )
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=str(choice.get("finish_reason") or "stop"),
            request_id=str(payload.get("request_id", request_id)),
            engine_url=self.url,
            weight_versions=spans,
        )

    async def healthy(self) -> bool:
        try:
            return (await self._client.get("/health", timeout=2.0)).status_code == 200
        except httpx.HTTPError:
            return False

    async def close(self) -> None:
        await self._client.aclose()


def _engine_failure(response: httpx.Response) -> Exception:
    text = response.text[:2000]
    if response.status_code in (502, 503, 504):
        return EngineUnavailable(f"engine answered {response.status_code}: {text}")
    if response.status_code == 400 and "maximum model length" in text:
        return ContextOverflow(f"the prompt does not fit the model's context window: {text}")
    return EngineError(f"engine answered {response.status_code}: {text}")
