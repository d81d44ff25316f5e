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
from ingress.turns.generation import Sample
from ingress.turns.prompts import AnyCall
from ingress.turns.session_log import Publish, PublishTogether
from ingress.turns.steps import advance_chain, answer_message, step_event
from ingress.turns.tracing import CallSpan
from schemas.events import LogprobsMode, StepRecorded
from schemas.images import ImageProcessorFingerprint
from titoflow.engine.api import EngineImage
from titoflow.image_store import ImageStore
from titoflow.tito.prompt_images import data_url_bytes

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
        calls: Sequence[AnyCall],
        samples: Sequence[Sample],
        version: str | None,
        span: CallSpan,
        stream: bool = False,
    ) -> list[StepRecorded]:
        """The steps of ``calls`` (one, or the ``n`` samples of one chat request, sharing one
        prompt) from their ``samples``, durable: one published alone, several together (all
        recorded or none, see the module doc); only then does any chain advance. ``version``
        is the weight version the calls were admitted under."""
        answers = [
            answer_message(sample.parsed) if sample.parsed is not None else None
            for sample in samples
        ]
        steps = [
            step_event(
                call,
                sample.generation,
                sample.engine_ms,
                stream,
                sample.parsed,
                answer,
                self.logprobs_mode,
                self.image_processor,
            )
            for call, sample, answer in zip(calls, samples, answers, strict=True)
        ]
        images = calls[0].params.images  # the samples share one prompt
        if images:  # a text-only call awaits nothing more
            await self._store(images)
        if len(steps) == 1:
            await self.publish(steps[0])
        else:
            assert self.publish_together is not None, "ChatService refuses n > 1 without it"
            await self.publish_together(steps)
        loop = asyncio.get_running_loop()
        for call, step, answer in zip(calls, steps, answers, strict=True):
            span.recorded(step, len(call.prompt))
            # Counted on the next loop iteration: the answer leaves 0.1 ms sooner.
            loop.call_soon(_count, step, len(call.prompt), call.started)
            advance_chain(self.chains, call, step, answer, self.end_ids, version)
        return steps

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
