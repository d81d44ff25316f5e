"""An :class:`~titoflow.engine.api.Engine` that lives through pauses: what the ingress generates
with.

- Versions: every token carries the weight version that sampled it — the engine's own spans
  where it reports them, else the control log's version when the piece started.
- Abort-mode pause: the engine ends in-flight generations at a token boundary
  (``finish_reason: abort``) with the tokens so far. This wrapper keeps them, waits for the
  resume and continues with prompt + those tokens for the remaining ``max_tokens``, as one
  generation: a streaming caller sees tokens go on, a non-streaming one gets the whole of it,
  and the step records the stitched tokens with each piece's versions.
- An abort nobody paused for (no pause applied within ``abort_grace_s``, e.g. an operator's
  ``/abort_requests``) ends the generation as the engine said.
Admission (holding new requests while paused) is the service's job; in ``keep`` mode the engine
freezes in-flight requests itself and their spans tell the versions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace

from ingress.control.control_state import PauseGate
from ingress.turns import metrics
from schemas.events import VersionSpan
from schemas.routed_experts import RoutedExperts
from titoflow.engine.api import Engine, GenerateParams, Generation, GenerationChunk, TopLogprobs

# How long an unexplained abort waits for the pause that explains it: a trainer that drives the
# engine itself may pause it a moment before its Pause event reaches this replica.
ABORT_GRACE_S = 2.0


@dataclass
class _Pieces:
    """Tokens of the pieces so far, and their version spans over the whole completion."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: TopLogprobs = field(default_factory=list)
    spans: list[VersionSpan] = field(default_factory=list)
    experts: RoutedExperts | None = None  # MoE routing of all pieces, when the engine gives it

    def add_tokens(self, chunk: GenerationChunk | Generation) -> None:
        self.token_ids += chunk.token_ids
        self.logprobs += chunk.logprobs
        self.top_logprobs += chunk.top_logprobs

    def add_spans(self, spans: list[VersionSpan], start: int, version: str | None) -> None:
        """Spans of the piece that began at completion index ``start`` and ends here; when the
        engine gave none, the piece is stamped with ``version`` (the control log's)."""
        end = len(self.token_ids)
        if not spans and version is not None and end > start:
            spans = [VersionSpan(version=version, start=0, end=end - start)]
        for span in spans:
            shifted = VersionSpan(
                version=span.version, start=start + span.start, end=start + span.end
            )
            last = self.spans[-1] if self.spans else None
            if last is not None and last.version == shifted.version and last.end == shifted.start:
                self.spans[-1] = VersionSpan(
                    version=last.version, start=last.start, end=shifted.end
                )
            else:
                self.spans.append(shifted)

    def add_experts(self, rows: RoutedExperts | None) -> None:
        """Append a piece's routed-expert rows after those of the pieces before it."""
        if rows is None or self.experts is None:
            self.experts = rows if self.experts is None else self.experts
            return
        new = rows.between(self.experts.end, rows.end)
        if new is None or new.start != self.experts.end or new.layout() != self.experts.layout():
            return  # not contiguous: keep what is certain
        self.experts = self.experts.model_copy(
            update={
                "shape": (self.experts.rows + new.rows, *self.experts.shape[1:]),
                "data": self.experts.data + new.data,
            }
        )


class PausableEngine:
    def __init__(
        self, inner: Engine, gate: PauseGate, abort_grace_s: float = ABORT_GRACE_S
    ) -> None:
        self.inner = inner
        self.gate = gate
        self.abort_grace_s = abort_grace_s
        self.url = inner.url

    async def _continues(self, finish_reason: str, pauses: int, remaining: int) -> bool:
        """Whether a piece that ended so was cut by a pause (to continue after the resume)."""
        if finish_reason != "abort" or remaining <= 0:
            return False
        return (
            self.gate.paused
            or self.gate.pauses > pauses
            or await self.gate.wait_pause_after(pauses, self.abort_grace_s)
        )

    async def _resumed(self) -> None:
        await self.gate.wait_resumed()
        metrics.CONTINUED_AFTER_ABORT.inc()

    def _piece_params(self, params: GenerateParams, prompt_len: int, done: int) -> GenerateParams:
        """The rest of ``params`` after ``done`` tokens; routed experts only for new rows (the
        last sampled token is first fed to the model by the continuation)."""
        if not done:
            return params
        return replace(
            params,
            max_tokens=params.max_tokens - done,
            routed_experts_start=prompt_len + done - 1,
        )

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> Generation:
        done = _Pieces()
        attempt = 0
        while True:
            pauses, version, start = self.gate.pauses, self.gate.version, len(done.token_ids)
            piece = await self.inner.generate(
                _continued(prompt_ids, done.token_ids),
                self._piece_params(params, len(prompt_ids), start),
                request_id if attempt == 0 else f"{request_id}-c{attempt}",
                session_id=session_id,
            )
            done.add_tokens(piece)
            done.add_spans(piece.weight_versions, start, version)
            done.add_experts(piece.routed_experts)
            remaining = params.max_tokens - len(done.token_ids)
            if not await self._continues(piece.finish_reason, pauses, remaining):
                return replace(
                    piece,
                    token_ids=done.token_ids,
                    logprobs=done.logprobs,
                    top_logprobs=done.top_logprobs,
                    weight_versions=done.spans,
                    routed_experts=done.experts,
                    request_id=request_id,
                )
            await self._resumed()
            attempt += 1

    async def generate_stream(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> AsyncIterator[GenerationChunk]:
        done = _Pieces()
        attempt = 0
        while True:
            pauses, version, start = self.gate.pauses, self.gate.version, len(done.token_ids)
            last: GenerationChunk | None = None
            async for chunk in self.inner.generate_stream(
                _continued(prompt_ids, done.token_ids),
                self._piece_params(params, len(prompt_ids), start),
                request_id if attempt == 0 else f"{request_id}-c{attempt}",
                session_id=session_id,
            ):
                done.add_tokens(chunk)
                if chunk.finish_reason is None:
                    yield chunk
                else:
                    last = chunk
            if last is None:  # the engine ended the stream without a finish: as it is
                return
            done.add_spans(last.weight_versions, start, version)
            done.add_experts(last.routed_experts)
            remaining = params.max_tokens - len(done.token_ids)
            if not await self._continues(last.finish_reason or "stop", pauses, remaining):
                yield replace(last, weight_versions=done.spans, routed_experts=done.experts)
                return
            if last.token_ids:  # the aborted piece's last tokens, as ordinary ones, at once
                yield replace(
                    last,
                    finish_reason=None,
                    weight_versions=[],
                    stop_reason=None,
                    routed_experts=None,
                )
            await self._resumed()
            attempt += 1

    async def healthy(self) -> bool:
        return await self.inner.healthy()

    async def close(self) -> None:
        await self.inner.close()


def _continued(prompt_ids: Sequence[int], sampled: list[int]) -> Sequence[int]:
    """The prompt of the next piece: the call's own, untouched (an engine serializes a chain's
    array without converting it), until a pause cut some tokens off it."""
    return [*prompt_ids, *sampled] if sampled else prompt_ids
