"""Recording an engine call's step: published, observed, then cached.

Invariant: a chain advances only after its step was published (the broker acknowledged it), so
a call that fails anywhere before leaves the cache as it was, and a retry extends the same chain
as a new sample. The ``n`` samples of one request are published together, as one batch the
broker appends whole or not at all, so they are all recorded or none is; only then do their
chains advance, each a tip beside the others. A step is published only once the bytes of every
image it names are in the image store, and each of them marked named now (its mtime, refreshed;
written if the store does not hold it, new or pruned since), in a worker thread, so a trainer
can read what a step names and a prune (titoflow/image_store.py) spares what a recent step
names. Metrics and the log line wait for nothing: they are counted on the loop's next turn, once
the answer is on its way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ingress.turns import metrics
from ingress.turns.chains import ChainStore
from ingress.turns.prompts import AnyCall
from ingress.turns.session_log import Publish, PublishTogether
from ingress.turns.steps import advance_chain, answer_message, step_event
from ingress.turns.tracing import CallSpan
from schemas.events import LogprobsMode, StepRecorded
from schemas.images import ImageProcessorFingerprint
from titoflow.engine.api import EngineImage, Generation
from titoflow.image_store import ImageStore
from titoflow.tito.images import data_url_bytes
from titoflow.tito.messages import Message
from titoflow.tito.output import ParsedOutput

log = logging.getLogger("titoflow.ingress")


@dataclass(frozen=True)
class StepRecorder:
    publish: Publish
    chains: ChainStore
    end_ids: frozenset[int]  # the tokens that end a generation: does a head end its turn?
    logprobs_mode: LogprobsMode = "raw_logprobs"  # what the engines' logprobs are
    # None: a service without a broker's batches (tests, benchmarks): one sample per request.
    publish_together: PublishTogether | None = None
    # Both set where the policy reads images (ServiceOptions checks it).
    image_processor: ImageProcessorFingerprint | None = None
    image_store: ImageStore | None = None

    async def record(
        self,
        call: AnyCall,
        version: str | None,
        generation: Generation,
        engine_ms: float,
        span: CallSpan,
        parsed: ParsedOutput | None = None,
        stream: bool = False,
    ) -> StepRecorded:
        """The step of ``call``, durable; ``parsed`` is a chat turn's output (None: white-box),
        ``version`` the weight version the call was admitted under."""
        answer = answer_message(parsed) if parsed is not None else None
        step = self._step(call, generation, engine_ms, stream, parsed, answer)
        if call.params.images:  # a text-only call awaits nothing more
            await self._store(call.params.images)
        await self.publish(step)
        span.recorded(step, len(call.prompt))
        # Counted on the next loop iteration: the answer leaves 0.1 ms sooner.
        asyncio.get_running_loop().call_soon(_count, step, len(call.prompt), call.started)
        advance_chain(self.chains, call, step, answer, self.end_ids, version)
        return step

    async def record_samples(
        self,
        samples: Sequence[tuple[AnyCall, Generation, float, ParsedOutput]],
        version: str | None,
        span: CallSpan,
        stream: bool,
    ) -> list[StepRecorded]:
        """The steps of the samples of one chat request (call, generation, engine ms, parsed),
        published together (all recorded or none, see the module doc); only then does any
        chain advance."""
        assert self.publish_together is not None, "ChatService refuses n > 1 without it"
        answers = [answer_message(parsed) for *_, parsed in samples]
        steps = [
            self._step(call, generation, engine_ms, stream, parsed, answer)
            for (call, generation, engine_ms, parsed), answer in zip(samples, answers, strict=True)
        ]
        images = samples[0][0].params.images  # the samples share one prompt
        if images:
            await self._store(images)
        await self.publish_together(steps)
        loop = asyncio.get_running_loop()
        for (call, *_), step, answer in zip(samples, steps, answers, strict=True):
            span.recorded(step, len(call.prompt))
            loop.call_soon(_count, step, len(call.prompt), call.started)
            advance_chain(self.chains, call, step, answer, self.end_ids, version)
        return steps

    def _step(
        self,
        call: AnyCall,
        generation: Generation,
        engine_ms: float,
        stream: bool,
        parsed: ParsedOutput | None,
        answer: Message | None,
    ) -> StepRecorded:
        return step_event(
            call,
            generation,
            engine_ms,
            stream,
            parsed,
            answer,
            self.logprobs_mode,
            self.image_processor,
        )

    async def _store(self, images: Sequence[EngineImage]) -> None:
        """Every image the step names in the image store, marked named now; those the engine
        was sent by uuid alone too (a chain's history: its steps name them all)."""
        await asyncio.to_thread(_write, self.image_store, images)


def _write(store: ImageStore | None, images: Sequence[EngineImage]) -> None:
    assert store is not None, "ServiceOptions holds a store wherever images are read"
    for image in images:
        # Stored by an earlier step: a utime, not decoded again. Else new, or pruned after
        # no step named it for the prune's age: written (a chain's images keep their URL).
        if not store.refresh(image.uuid):
            store.put(data_url_bytes(image.url), image.uuid)


def _count(step: StepRecorded, prompt_len: int, started: float) -> None:
    """Metrics and the log line of a recorded step, whose call ends now. The line is DEBUG: the
    step itself is on the steps topic and in the metrics, and a JSON line per step costs CPU on
    every turn (docs/benchmarks.md §4h)."""
    counted = metrics.step_metrics(step.api, step.prefix)
    counted.steps.inc()
    if step.tool_parse_error:
        counted.tool_parse_errors.inc()
    metrics.PROMPT_TOKENS.inc(prompt_len)
    metrics.COMPLETION_TOKENS.inc(len(step.completion_ids))
    turn_seconds = time.perf_counter() - started
    counted.turn_seconds.observe(turn_seconds)
    counted.overhead_seconds.observe(turn_seconds - step.engine_ms / 1000)
    if not log.isEnabledFor(logging.DEBUG):
        return
    log.debug(
        "step recorded",
        extra={
            "session_id": step.session_id,
            "step_id": step.step_id,
            "prefix": step.prefix,
            "prompt_tokens": prompt_len,
            "completion_tokens": len(step.completion_ids),
            "tool_parse_error": step.tool_parse_error,
        },
    )
