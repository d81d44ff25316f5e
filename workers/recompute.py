"""The recompute stage: fills in the logprobs of rebuilt tokens with the engine's prompt logprobs.

The assembly worker sends a segment whose tokens include some with ``logprob_source`` 3 (a
prefix rebuilt after a divergence, a re-rendered ``last-step`` turn) to ``<prefix>.recompute``
instead of ``<prefix>.segments``. This stage — its own consumer group and process, so a slow
engine never stalls assembly of other sessions — asks the engine for the prompt logprobs of the
segment's tokens up to the last such token, writes them in, stamps the weight version that
computed them, and publishes the segment, unchanged otherwise (same id, so replays and
redeliveries stay byte-identical while the weights are), to ``<prefix>.segments``.

Kill switch (``recompute_disabled``): no engine call; those tokens get loss mask 0 and source 0
(``none``). So does a token the engine refuses to score: never a silent zero.

One policy per segment step: a filled-in logprob is of the distribution its step's sampling
record names, like the step's sampled ones. vLLM's prompt logprobs skip the sampling processors,
so they are raw in either ``--logprobs-mode`` (vllm/v1/worker/gpu_model_runner.py, 0.32); a
step that recorded processed logprobs at a temperature other than 1, with a cut or a penalty has
its pending tokens masked (``recompute_masked_processed``) instead of given a raw value.

It is a FastStream batch subscriber (:mod:`titoflow.bus.subscription`): a batch is acknowledged
(its offsets committed) once every segment it held is published.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Protocol

from prometheus_client import start_http_server
from pydantic import ValidationError

from schemas.events import (
    LOGPROB_SOURCE_NONE,
    RecomputeRequested,
    SamplingUsed,
    SegmentFinalized,
    VersionSpan,
)
from schemas.reasons import DeadLetterReason
from titoflow.bus import (
    Batch,
    BatchSubscription,
    ConsumerRecord,
    RecordPublisher,
    StreamPublisher,
    ensure_topics,
)
from titoflow.engine.api import PromptScores
from titoflow.engine.vllm import VLLMEngine
from titoflow.errors import EngineError, EngineUnavailable
from titoflow.settings import Settings
from workers import metrics
from workers.assembly.pending import pending_positions
from workers.rebuild import runs
from workers.worker import publish_dead_letter

log = logging.getLogger("titoflow.recompute")

RETRY_BACKOFF_S = (0.5, 30.0)
# Why a request goes to the DLQ instead of its segment, and the detail.
Unusable = tuple[DeadLetterReason, str]


class PromptScorer(Protocol):
    async def prompt_logprobs(self, token_ids: list[int], request_id: str) -> PromptScores: ...


def fill(segment: SegmentFinalized, scores: PromptScores) -> SegmentFinalized:
    """``segment`` with its pending logprobs taken from ``scores`` (prompt logprobs of its
    tokens); a position the engine gave none for is masked."""
    logprobs, loss_mask, source = (
        list(segment.logprobs),
        list(segment.loss_mask),
        list(segment.logprob_source),
    )
    scored = bytearray(len(segment.token_ids))
    for p in pending_positions(segment):
        value = scores.logprobs[p] if p < len(scores.logprobs) else None
        if value is None:
            loss_mask[p], source[p], logprobs[p] = 0, LOGPROB_SOURCE_NONE, 0.0
        else:
            logprobs[p], scored[p] = value, 1
    versions = list(segment.weight_versions)
    if scores.weight_version is not None:
        versions += [
            VersionSpan(version=scores.weight_version, start=a, end=b)
            for a, b in runs(scored, 0, len(scored))
        ]
    metrics.RECOMPUTE_TOKENS.labels("recomputed").inc(sum(scored))
    return _with_labels(
        segment,
        logprobs,
        loss_mask,
        source,
        weight_versions=sorted(versions, key=lambda v: v.start),
    )


def mask(segment: SegmentFinalized, where: list[int], reason: str) -> SegmentFinalized:
    """``segment`` with its pending tokens at ``where`` masked (loss mask 0, source none),
    counted as ``recompute_masked_<reason>``."""
    loss_mask, source = list(segment.loss_mask), list(segment.logprob_source)
    logprobs = list(segment.logprobs)
    for p in where:
        loss_mask[p], source[p], logprobs[p] = 0, LOGPROB_SOURCE_NONE, 0.0
    diagnostics = dict(segment.diagnostics)
    diagnostics[f"recompute_masked_{reason}"] = len(where)
    metrics.RECOMPUTE_TOKENS.labels(f"masked_{reason}").inc(len(where))
    return _with_labels(segment, logprobs, loss_mask, source, diagnostics=diagnostics)


def prompt_logprobs_fit(sampling: SamplingUsed | None) -> bool:
    """Whether the engine's (raw) prompt logprob of a token is of the distribution its step's
    logprobs are: raw ones (a step without a record predates processed logprobs), or processed
    ones where sampling changed nothing — temperature 1, no cut, no penalty."""
    if sampling is None or sampling.logprobs_mode == "raw_logprobs":
        return True
    return sampling.temperature == 1.0 and not sampling.cut and sampling.repetition_penalty == 1.0


def unfit_positions(segment: SegmentFinalized, where: list[int]) -> list[int]:
    """Those of ``where`` in the completion of a step :func:`prompt_logprobs_fit` rejects
    (pending tokens are only ever in steps' completions: :func:`workers.rebuild.relabel`)."""
    spans = [
        (step.completion_start, step.completion_end)
        for step in segment.steps
        if not prompt_logprobs_fit(step.sampling)
    ]
    return [p for p in where if any(start <= p < end for start, end in spans)]


def _with_labels(
    segment: SegmentFinalized,
    logprobs: list[float],
    loss_mask: list[int],
    source: list[int],
    **more: Any,
) -> SegmentFinalized:
    """``segment`` with new per-token logprobs, loss mask and logprob sources (and ``more``)."""
    return segment.model_copy(
        update={"logprobs": logprobs, "loss_mask": loss_mask, "logprob_source": source, **more}
    )


async def complete(segment: SegmentFinalized, scorer: PromptScorer | None) -> SegmentFinalized:
    """The finished segment: pending logprobs recomputed by ``scorer``, or masked without one
    (the kill switch), when the engine refuses the request (EngineUnavailable propagates: the
    caller retries) or where prompt logprobs are of another policy than their step's."""
    unfit = unfit_positions(segment, pending_positions(segment))
    if unfit:
        segment = mask(segment, unfit, "processed")
    where = pending_positions(segment)
    if not where:
        return segment
    if scorer is None:
        return mask(segment, where, "disabled")
    request_id = f"recompute-{segment.segment_id}-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    try:
        scores = await scorer.prompt_logprobs(segment.token_ids[: where[-1] + 1], request_id)
    except EngineUnavailable:
        raise
    except EngineError as exc:
        log.warning("engine refused recompute of %s: %s", segment.segment_id, exc)
        return mask(segment, where, "refused")
    metrics.RECOMPUTE_SECONDS.observe(time.perf_counter() - started)
    return fill(segment, scores)


class RecomputeWorker:
    """A consumer-group member on ``<prefix>.recompute`` publishing finished segments."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.requests = BatchSubscription(
            settings,
            settings.topic("recompute"),
            settings.recompute_group,
            self._apply,
            log,
            max_records=4 * settings.recompute_concurrency,
        )
        self.publisher: RecordPublisher = StreamPublisher(self.requests.broker, settings)
        self.engine = VLLMEngine(settings.engine_url, settings.engine_timeout_s)
        self.limit = asyncio.Semaphore(max(1, settings.recompute_concurrency))
        self.in_flight = 0
        self.stop = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        if self.settings.recompute_metrics_port:
            start_http_server(self.settings.recompute_metrics_port, addr=self.settings.metrics_host)
        self.stop = stop
        await self.requests.run(
            stop,
            starting=[self._start],
            tick=self._observe,
            stopped=[self.engine.close],
        )

    async def _start(self) -> None:
        await ensure_topics(self.settings)

    async def _apply(self, batch: Batch) -> None:
        records = batch.records
        self.in_flight = len(records)
        await self._observe()
        # Engine calls run concurrently; results are published in the order read, so a
        # session's segments keep their order (its last one last).
        finished = await asyncio.gather(*(self._finish(r, self.stop) for r in records))
        for record, result in zip(records, finished, strict=True):
            await self._publish(record, result)
        self.in_flight = 0
        # Everything fetched is published: its offsets may go (bounded as the worker's).
        if not await batch.commit(self.settings.publish_timeout_s):
            log.info("commit lost to a rebalance; segments will be republished")
        await self._observe()

    async def _observe(self) -> None:
        consumer = self.requests.consumer
        unread = 0
        for tp in consumer.assignment():
            highwater = consumer.highwater(tp)
            if highwater is not None:
                unread += max(highwater - await consumer.position(tp), 0)
        metrics.RECOMPUTE_QUEUE.set(unread + self.in_flight)

    async def _finish(
        self, record: ConsumerRecord, stop: asyncio.Event
    ) -> SegmentFinalized | Unusable:
        """The finished segment of ``record``, or why it goes to the DLQ."""
        try:
            request = RecomputeRequested.model_validate_json(record.value or b"")
        except ValidationError as exc:
            errors = str(exc.errors(include_url=False)[:3])
            return DeadLetterReason.UNDECODABLE_RECOMPUTE_REQUEST, errors
        scorer = None if self.settings.recompute_disabled else self.engine
        backoff = RETRY_BACKOFF_S[0]
        while True:
            try:
                async with self.limit:
                    return await complete(request.segment, scorer)
            except EngineUnavailable as exc:  # wait for the engine; never mask what it could do
                log.warning("engine unavailable for recompute, retrying: %s", exc)
                if stop.is_set():
                    raise
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, RETRY_BACKOFF_S[1])
            except Exception as exc:  # a bug must cost one segment, not the partition
                log.exception("recompute of offset %d failed", record.offset)
                return DeadLetterReason.RECOMPUTE_ERROR, repr(exc)

    async def _publish(self, record: ConsumerRecord, result: SegmentFinalized | Unusable) -> None:
        if isinstance(result, tuple):
            await publish_dead_letter(self.publisher, self.settings, record, *result)
            return
        key = result.instance_id or result.session_id
        await self.publisher.publish(
            self.settings.topic("segments"), key, result.model_dump_json().encode()
        )
        log.info(
            "recomputed segment published",
            extra={"session_id": result.session_id, "segment_id": result.segment_id},
        )
