"""What the ingress and workers see of an engine, whatever serves it: the token-in/token-out
calls (:class:`Engine`), the control plane's calls (:class:`EngineControl`) and their values.
Ids always come from the engine, never from re-encoding text; clients live beside this module
(:mod:`titoflow.engine.vllm`, :mod:`titoflow.engine.sglang`, :mod:`titoflow.engine.pool`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from schemas.events import VersionSpan
from schemas.routed_experts import RoutedExperts

TopLogprobs = list[list[tuple[int, float]]]


@dataclass(frozen=True)
class EngineImage:
    """An image of the prompt (titoflow/engine/image_expansion.py): its run of ``length``
    placeholder ids at ``offset`` in the canonical, expanded prompt; ``uuid`` names its bytes
    (their sha256: an engine answers a cached uuid with the cached image, whatever bytes come
    with it); ``url`` is a ``data:`` URL or an address the engine fetches. ``by_uuid`` sends it
    without its URL (an image the engine was sent before); a client resends the URL if the
    engine lost it."""

    offset: int
    length: int
    uuid: str
    url: str
    by_uuid: bool = False
    grid_thw: tuple[int, int, int] = (1, 0, 0)  # the processor's patch grid: recorded, not sent


@dataclass(frozen=True)
class GenerateParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k cut (both engines' default, so it is sent only when set)
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0
    structured: dict[str, Any] | None = None  # extra sampling params of constrained decoding
    # First prompt position whose routed experts are wanted (rows before it were recorded by
    # earlier steps); only an engine that returns routed experts uses it.
    routed_experts_start: int = 0
    # The prompt's images, in order: the prompt holds their expanded runs, the engine is sent
    # one placeholder each and must expand them back to the same ids.
    images: tuple[EngineImage, ...] = ()

    def optional_sampling(self, seed_key: str) -> dict[str, Any]:
        """The sampling fields an engine is sent only where the request sets them: ``top_k``,
        the seed (under the engine's ``seed_key``) and the stop strings."""
        fields: dict[str, Any] = {}
        if self.top_k != -1:
            fields["top_k"] = self.top_k
        if self.seed is not None:
            fields[seed_key] = self.seed
        if self.stop:
            fields["stop"] = list(self.stop)
        return fields


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
    routed_experts: RoutedExperts | None = None  # on the last chunk: the whole request's rows


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
    # Positions of prompt + completion; None unless the engine returns routed experts.
    routed_experts: RoutedExperts | None = None

    @classmethod
    def whole(cls, chunk: GenerationChunk, request_id: str, engine_url: str) -> Generation:
        """A non-streamed answer, parsed as one final chunk."""
        return cls(
            token_ids=chunk.token_ids,
            logprobs=chunk.logprobs,
            finish_reason=chunk.finish_reason or "stop",
            request_id=request_id,
            engine_url=engine_url,
            weight_versions=chunk.weight_versions,
            top_logprobs=chunk.top_logprobs,
            stop_reason=chunk.stop_reason,
            routed_experts=chunk.routed_experts,
        )


@dataclass(frozen=True)
class PromptScores:
    logprobs: list[float | None]  # per prompt token; None for the first (nothing precedes it)
    weight_version: str | None  # of the weights that computed them, if the engine says


class Engine(Protocol):
    """One engine, or a pool of them (titoflow/engine/pool.py). ``session_id`` is the routing
    key (the session id, or with group routing its group's instance id:
    titoflow/engine/groups.py): a pool keeps a key on one engine (its prefix cache); SGLang
    passes it on as its own ``routing_key``; vLLM ignores it."""

    url: str

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> Generation: ...

    def generate_stream(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> AsyncIterator[GenerationChunk]: ...

    async def healthy(self) -> bool: ...

    async def close(self) -> None: ...


@runtime_checkable
class EngineControl(Protocol):
    """What the control plane drives on each engine the ingress knows (vLLM's RL routes)."""

    url: str

    async def pause(self, mode: Literal["keep", "abort"]) -> None: ...

    async def resume(self) -> None: ...

    async def is_paused(self) -> bool: ...

    async def set_weight_version(self, version: str) -> None: ...

    async def weight_version(self) -> str: ...
