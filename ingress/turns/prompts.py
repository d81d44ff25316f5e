"""A call's prompt, built from the session's cached chains, ready for the engine.

Invariants:
- Exact tokens: where a cached chain holds the start of the call, the prompt is that chain's
  tokens, untouched, plus a tail (TITO): for a chat turn the template's continuation of the
  messages the chain does not hold, for a white-box call the caller's ids past the chain.
  Otherwise the tail is the whole prompt: the conversation rendered in full, or the caller's
  ids as sent. The prompt shares the chain's storage (``SharedTokens``): building it costs the
  tail, not the conversation.
- One step id per engine call: drawn here for every prepared call, so two calls never share one,
  even for the same prompt (a client retry, best-of-n, the ``n`` samples of one request).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from ingress.turns import metrics
from ingress.turns.chains import Chain, ChainStore
from ingress.turns.service_options import ServiceOptions
from ingress.turns.turn import ChatTurn, TokenCall
from ingress.turns.turn_images import has_images, with_images
from schemas.events import step_id_for
from titoflow.engine.api import GenerateParams
from titoflow.errors import ContextOverflow, InvalidRequest, NotAppendOnly
from titoflow.tito.families.grammar import tool_call_constraint
from titoflow.tito.messages import Matcher, Message
from titoflow.tito.prompt_images import IMAGE_PAD
from titoflow.tito.render import ChatRenderer
from titoflow.tito.shared_tokens import SharedTokens
from titoflow.tito.tokenizer import TooLong

Request = TypeVar("Request", ChatTurn, TokenCall)


@dataclass(frozen=True)
class PreparedCall(Generic[Request]):
    """One engine call, ready to run: a chat turn's or a white-box call's alike."""

    request: Request
    parent: Chain | None  # the cached chain the prompt extends; None: the tail is the prompt
    covered: int  # the chat turn's messages the parent holds (0 for a white-box call)
    tail: array[int]
    prompt: SharedTokens
    step_id: str
    request_id: str  # unique per engine call (vLLM aborts by request id); starts with step_id
    params: GenerateParams
    matcher: Matcher  # how the prompt was matched to its chain (white-box: token for token)
    started: float  # perf_counter when the call arrived
    render_ms: float


AnyCall = PreparedCall[ChatTurn] | PreparedCall[TokenCall]


# Past this many characters of text to tokenize, a turn is rendered in a worker thread (with the
# tokenizer's GIL-releasing call), so a megabyte tool result does not hold the event loop, and
# every other session on the replica, for seconds; below it the work takes less than the thread
# hop is worth. The tools are rendered but not tokenized (a continuation of a family with
# ``tools_stand_in`` renders a stand-in instead): they count for a 64th, whatever the path.
# Figures: docs/benchmarks.md §3c.
OFF_LOOP_CHARS = 8_192
TOOLS_WEIGHT = 64


def _text_size(messages: Sequence[Message]) -> int:
    """The characters of ``messages`` a template writes out (content, reasoning, calls)."""
    return sum(
        len(m.content)
        + len(m.reasoning or "")
        + sum(len(call.arguments) + len(call.name) for call in m.tool_calls)
        for m in messages
    )


def _first_new_row(prefix_len: int) -> int:
    """The first position whose routed experts no earlier step of the chain recorded: the
    parent's last token, which is first fed to the model by this step's request."""
    return max(prefix_len - 1, 0)


def _ready(
    request: Request,
    parent: Chain | None,
    covered: int,
    tail: array[int],
    prompt: SharedTokens,
    params: GenerateParams,
    matcher: Matcher,
    started: float,
    render_ms: float,
) -> PreparedCall[Request]:
    """The call with its own sample drawn: the step id, and the engine request id that starts
    with it."""
    sample = uuid.uuid4().hex
    parent_step_id = parent.head_step_id if parent else None
    step_id = step_id_for(request.session.session_id, parent_step_id, tail, sample)
    request_id = f"{step_id}-{sample[:8]}"
    return PreparedCall(
        request,
        parent,
        covered,
        tail,
        prompt,
        step_id,
        request_id,
        params,
        matcher,
        started,
        render_ms,
    )


def samples_of(call: PreparedCall[ChatTurn], n: int) -> list[PreparedCall[ChatTurn]]:
    """``n`` engine calls of ``call``'s prompt, ``call`` first, each with its own step id and
    engine request id: siblings under one parent, as re-samples of a prompt are. With a seed,
    sample ``i`` samples with ``seed + i``, as vLLM seeds the samples of its own ``n``."""
    seed = call.params.seed
    others = [
        _ready(
            call.request,
            call.parent,
            call.covered,
            call.tail,
            call.prompt,
            call.params if seed is None else replace(call.params, seed=seed + i),
            call.matcher,
            call.started,
            call.render_ms,
        )
        for i in range(1, n)
    ]
    return [call, *others]


@dataclass(frozen=True)
class PromptBuilder:
    renderer: ChatRenderer
    chains: ChainStore
    options: ServiceOptions

    async def for_turn(self, turn: ChatTurn) -> PreparedCall[ChatTurn]:
        """:meth:`for_turn_now`, in a worker thread where the text to render is large, so the
        event loop goes on serving other sessions meanwhile."""
        found = self._find(turn)
        fresh = turn.messages[found[1] :] if found else turn.messages
        if _text_size(fresh) + len(turn.tools_key) // TOOLS_WEIGHT < OFF_LOOP_CHARS:
            return self._render(turn, found)
        metrics.OFF_LOOP_RENDERS.inc()
        return await asyncio.to_thread(self._render, turn, found)

    def for_turn_now(self, turn: ChatTurn) -> PreparedCall[ChatTurn]:
        """The longest cached chain the turn's messages extend, plus the template's continuation
        of the rest; on a miss, the whole conversation rendered."""
        return self._render(turn, self._find(turn))

    def _find(self, turn: ChatTurn) -> tuple[Chain, int] | None:
        return self.chains.find(
            turn.session.session_id, turn.messages, turn.tools_digest, self.options.matcher
        )

    def _render(self, turn: ChatTurn, found: tuple[Chain, int] | None) -> PreparedCall[ChatTurn]:
        """The prompt from ``found`` (a chain and the messages it covers), refused where a cheap
        lower bound on its length leaves the context no room, before tokenizing it."""
        started = time.perf_counter()
        continuation = None
        parent: Chain | None = None
        covered = 0
        limit = self.options.max_model_len
        try:
            if found:
                parent, covered = found
                try:
                    continuation = self.renderer.continuation(
                        turn.messages,
                        covered,
                        parent.end_token,
                        turn.tools,
                        turn.template_kwargs,
                        budget=limit - len(parent.tokens) - 1,
                    )
                except NotAppendOnly:  # e.g. a later system message the template moves up front
                    metrics.NOT_APPEND_ONLY.inc()
            if parent is not None and continuation is not None:
                tail = array("i", continuation)
            else:
                parent, covered = None, 0
                tail = array(
                    "i",
                    self.renderer.full_prompt(
                        turn.messages,
                        turn.tools,
                        turn.template_kwargs,
                        budget=limit - 1,
                        key=turn.render_key,
                    ),
                )
        except TooLong as exc:
            at_least = exc.at_least + (len(parent.tokens) if parent else 0)
            if not exc.counted:
                metrics.EARLY_CONTEXT_REFUSALS.inc()
            size = f"{at_least}" if exc.counted else f"at least {at_least}"
            raise ContextOverflow(
                f"the prompt has {size} tokens; the model's context is {limit} tokens",
                prompt_tokens=at_least,
                limit=limit,
            ) from exc
        images = None
        if (parent is not None and parent.images) or has_images(turn.messages[covered:]):
            pad_id = self.renderer.token_id(IMAGE_PAD)
            tail, images = with_images(self.options, pad_id, turn.messages, parent, covered, tail)
        prefix_len = len(parent.tokens) if parent else 0
        params = self._turn_params(turn, prefix_len)
        if images:
            params = replace(params, images=images)
        # Last, once the call is not refused: its tail is written into the parent's store (a
        # refused call's would stay there, and the chain's next call would copy to fork).
        prompt = parent.tokens + tail if parent else SharedTokens.of(tail)
        render_ms = (time.perf_counter() - started) * 1000
        matcher = self.options.matcher
        return _ready(turn, parent, covered, tail, prompt, params, matcher, started, render_ms)

    def for_tokens(self, call: TokenCall) -> PreparedCall[TokenCall]:
        """The caller's ids as they are: a prompt that starts with a cached chain's tokens
        extends that chain (the rest is the tail); otherwise the whole prompt is the tail of a
        new chain, which workers place as they place any cache miss."""
        started = time.perf_counter()
        ids = array("i", call.prompt_ids)
        parent = self.chains.find_tokens(call.session.session_id, ids)
        prefix_len = len(parent.tokens) if parent else 0
        tail = ids[prefix_len:]
        params = GenerateParams(
            max_tokens=call.max_tokens or self.options.default_max_tokens,  # fitted on admission
            routed_experts_start=_first_new_row(prefix_len),
            temperature=call.temperature,
            top_p=call.top_p,
            top_k=call.top_k,
            seed=call.seed,
            stop_token_ids=call.stop_token_ids,
            top_logprobs=call.top_logprobs,
            # The chain's images, by uuid: its expanded runs are in the caller's prompt too.
            images=parent.images if parent else (),
        )
        prompt = parent.tokens + tail if parent else SharedTokens.of(ids)  # once not refused
        # No messages (none covered), matched token for token, nothing rendered.
        return _ready(call, parent, 0, tail, prompt, params, "strict", started, 0.0)

    def _turn_params(self, turn: ChatTurn, prefix_len: int) -> GenerateParams:
        try:
            structured = tool_call_constraint(
                self.renderer.family,
                turn.tools,
                turn.tool_choice,
                turn.tool_choice_name,
                self.renderer.token_id,
            )
        except ValueError as exc:
            raise InvalidRequest(str(exc), "tool_choice") from exc
        return GenerateParams(
            # As asked: fitted to the context, caps and budget on admission.
            max_tokens=turn.sampling.max_tokens or self.options.default_max_tokens,
            temperature=turn.sampling.temperature,
            top_p=turn.sampling.top_p,
            top_k=turn.sampling.top_k,
            seed=turn.sampling.seed,
            stop_token_ids=self.renderer.stop_token_ids,
            stop=turn.sampling.stop,
            top_logprobs=turn.sampling.logprobs or 0,
            structured=structured,
            routed_experts_start=_first_new_row(prefix_len),
        )
