"""The ingress core: one turn from internal request to durable step. Knows no HTTP and no Kafka.

Invariants:
- Exact tokens: the prompt is the cached chain's tokens plus the template's continuation (TITO)
  or a full render on a cache miss; the completion is the engine's ids and logprobs, unchanged.
- A result means durable: :meth:`ChatService.complete` returns only after ``publish`` returned
  (the broker acknowledged the step); any failure before that raises and leaves the cache as it
  was, so a retry extends the same chain.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ingress.chains import Chain, ChainStore
from ingress.parsing import ParsedOutput, parse_output
from ingress.render import ChatRenderer
from ingress.turn import ChatTurn, Message, SessionRef
from schemas.events import SessionFinalized, StepRecorded
from titoflow.engine import Engine, GenerateParams, Generation
from titoflow.errors import ContextOverflow

Publish = Callable[[StepRecorded | SessionFinalized], Awaitable[None]]


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class TurnResult:
    step: StepRecorded
    parsed: ParsedOutput
    generation: Generation
    prompt_len: int


def step_id_for(session_id: str, parent_step_id: str | None, prompt_tail: array[int]) -> str:
    """Same session, parent and new prompt tokens ⇒ same step id (a retried turn)."""
    digest = hashlib.sha256(f"{session_id}\0{parent_step_id or ''}\0".encode())
    digest.update(prompt_tail.tobytes())
    return digest.hexdigest()[:32]


class ChatService:
    def __init__(
        self,
        renderer: ChatRenderer,
        decoder: Decoder,
        engine: Engine,
        publish: Publish,
        chains: ChainStore,
        max_model_len: int,
        default_max_tokens: int,
    ) -> None:
        self.renderer = renderer
        self.decoder = decoder
        self.engine = engine
        self.publish = publish
        self.chains = chains
        self.max_model_len = max_model_len
        self.default_max_tokens = default_max_tokens

    async def complete(self, turn: ChatTurn) -> TurnResult:
        started = time.perf_counter()
        tools_key = turn.tools_key()
        found = self.chains.find(turn.session.session_id, turn.messages, tools_key)
        if found:
            parent, covered = found
            tail = array(
                "i",
                self.renderer.continuation(
                    turn.messages,
                    covered,
                    parent.ends_with_terminator,
                    turn.tools,
                    turn.template_kwargs,
                ),
            )
            prompt = parent.tokens + tail
        else:
            parent, covered = None, 0
            tail = array(
                "i", self.renderer.full_prompt(turn.messages, turn.tools, turn.template_kwargs)
            )
            prompt = tail
        parent_step_id = parent.head_step_id if parent else None
        step_id = step_id_for(turn.session.session_id, parent_step_id, tail)
        render_ms = (time.perf_counter() - started) * 1000

        room = self.max_model_len - len(prompt)
        if room <= 0:
            raise ContextOverflow(
                f"the prompt has {len(prompt)} tokens; the model's context is {self.max_model_len}"
            )
        params = GenerateParams(
            max_tokens=min(turn.sampling.max_tokens or self.default_max_tokens, room),
            temperature=turn.sampling.temperature,
            top_p=turn.sampling.top_p,
            seed=turn.sampling.seed,
            stop_token_ids=(self.renderer.terminator_id,),
        )
        engine_started = time.perf_counter()
        # Unique per attempt: the engine rejects concurrent requests sharing an id.
        generation = await self.engine.generate(
            prompt.tolist(), params, request_id=f"{step_id}-{uuid.uuid4().hex[:8]}"
        )
        engine_ms = (time.perf_counter() - engine_started) * 1000

        parsed = parse_output(
            self.decoder.decode(generation.token_ids, skip_special_tokens=True), step_id
        )
        answer = Message(
            role="assistant",
            content=parsed.content,
            reasoning=parsed.reasoning,
            tool_calls=tuple(parsed.tool_calls),
        )
        step = StepRecorded(
            session_id=turn.session.session_id,
            event_time=time.time(),
            step_id=step_id,
            chain_id=parent.chain_id if parent else step_id,
            parent_step_id=parent_step_id,
            prefix="tito" if parent else "rendered",
            prefix_len=len(parent.tokens) if parent else 0,
            prompt_tail_ids=tail.tolist(),
            completion_ids=generation.token_ids,
            completion_logprobs=generation.logprobs,
            weight_versions=generation.weight_versions,
            finish_reason=generation.finish_reason,
            instance_id=turn.session.instance_id,
            turn_id=turn.session.turn_id,
            api=turn.api,
            model=turn.model,
            engine_url=generation.engine_url,
            engine_request_id=generation.request_id,
            new_messages=[m.template_dict() for m in turn.messages[covered:]],
            response_message=answer.template_dict(),
            tool_parse_error=parsed.parse_error,
            render_ms=render_ms,
            engine_ms=engine_ms,
        )
        await self.publish(step)

        completion = array("i", generation.token_ids)
        self.chains.advance(
            turn.session.session_id,
            parent,
            Chain(
                chain_id=step.chain_id,
                tools_key=tools_key,
                match_keys=tuple(m.match_key() for m in (*turn.messages, answer)),
                tokens=prompt + completion,
                head_step_id=step_id,
                ends_with_terminator=bool(completion)
                and completion[-1] == self.renderer.terminator_id,
            ),
        )
        return TurnResult(step=step, parsed=parsed, generation=generation, prompt_len=len(prompt))

    async def finalize(self, session: SessionRef, metadata: dict[str, Any]) -> SessionFinalized:
        event = SessionFinalized(
            session_id=session.session_id, event_time=time.time(), metadata=metadata
        )
        await self.publish(event)
        self.chains.forget(session.session_id)
        return event
