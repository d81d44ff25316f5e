"""Events made by hand, the tests' one factory of them: :func:`recorded_step` (a step event,
the fields a test does not look at filled: assembly, replay) and :data:`THREE_TURNS` (a
three-step TITO chain); :func:`assemble` (steps into segments, as a worker makes them);
:func:`filled_segment` (two steps with a tool result between them, every field filled: exports,
trainer formats), :func:`step_segment` (steps of context then completion: batches, topics) and
:func:`token_segment` (a token sequence as it is: packing, datasets); :func:`block` (routed
experts rows from an array: routing replay)."""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas.events import SegmentFinalized, SegmentStep, StepRecorded, VersionSpan
from schemas.routed_experts import RoutedExperts
from workers.assembler import Assembler

# A step of :func:`step_segment`: its context ids, completion ids and the completion's logprobs.
Step = tuple[list[int], list[int], list[float]]


def recorded_step(
    step_id: str,
    tail: list[int],
    completion: list[int],
    parent: str | None = None,
    prefix_len: int = 0,
    *,
    session: str = "s",
    **fields: Any,
) -> StepRecorded:
    """A step of ``session`` extending ``parent`` (TITO; none: rendered) by ``prefix_len`` ids,
    then ``tail``, completed with ``completion`` (logprobs -0.5, -1.0, ...); ``fields`` set any
    other field."""
    values: dict[str, Any] = {
        "session_id": session,
        "event_time": 0.0,
        "step_id": step_id,
        "chain_id": "c",
        "parent_step_id": parent,
        "prefix": "tito" if parent else "rendered",
        "prefix_len": prefix_len,
        "prompt_tail_ids": tail,
        "completion_ids": completion,
        "completion_logprobs": [-0.5 * (i + 1) for i in range(len(completion))],
        "finish_reason": "stop",
        "api": "openai.chat",
        "model": "m",
        "engine_url": "u",
        "engine_request_id": "r",
        "new_messages": [],
        "response_message": {},
        "render_ms": 0.0,
        "engine_ms": 0.0,
    }
    return StepRecorded(**{**values, **fields})


THREE_TURNS = [
    recorded_step("a", [1, 2, 3], [10, 11], instance_id="i1"),
    recorded_step("b", [4], [12], parent="a", prefix_len=5),
    recorded_step("c", [5, 6], [13, 14, 15], parent="b", prefix_len=7),
]


def assemble(events: list[StepRecorded], session: str = "s") -> list[SegmentFinalized]:
    """The segments an assembler makes of ``events`` (at offsets 0, 1, ... of partition 0), the
    session then finalized with metadata ``{"reward": 1.0}``."""
    assembler = Assembler()
    for offset, event in enumerate(events):
        assembler.add_step(event, partition=0, offset=offset)
    return assembler.finalize(session, "finalized", {"reward": 1.0})


def filled_segment(
    name: str,
    logprobs: list[float],
    *,
    instance: str | None = "prompt-1",
    reward: float | None = 1.0,
    experts: bool = False,
) -> SegmentFinalized:
    """A two-step segment: context, completion, a tool result, completion (``logprobs`` cover
    the completions, split in two)."""
    n = len(logprobs)
    first, second = logprobs[: n // 2], logprobs[n // 2 :]
    tokens = [7, 8, 9, *range(100, 100 + len(first)), 42, 43, *range(200, 200 + len(second))]
    mask = [0, 0, 0, *[1] * len(first), 0, 0, *[1] * len(second)]
    context = [0.0] * 3, [0.0] * 2
    lps = [*context[0], *first, *context[1], *second]
    source = [0, 0, 0, *[1] * len(first), 0, 0, *[2] * len(second)]
    middle = 3 + len(first)
    steps = [
        SegmentStep(
            step_id=f"{name}-0",
            prompt_start=0,
            completion_start=3,
            completion_end=middle,
            prefix="rendered",
            finish_reason="tool_calls",
        ),
        SegmentStep(
            step_id=f"{name}-1",
            prompt_start=middle,
            completion_start=middle + 2,
            completion_end=len(tokens),
            prefix="tito",
            finish_reason="stop",
        ),
    ]
    routed = None
    if experts:
        rows = len(tokens) - 1
        routed = RoutedExperts(
            start=0, shape=(rows, 2, 2), dtype="uint8", data=bytes(range(rows * 4))
        )
    return SegmentFinalized(
        session_id=f"sess-{name}",
        event_time=1_790_000_000.25,
        segment_id=f"seg-{name}",
        chain_id=f"{name}-0",
        instance_id=instance,
        rollout_id=f"sess-{name}",
        token_ids=tokens,
        loss_mask=mask,
        logprobs=lps,
        logprob_source=source,
        weight_versions=[VersionSpan(version="v1", start=3, end=len(tokens))],
        steps=steps,
        finalize_reason="finalized",
        split_reason="fork" if experts else None,
        routed_experts=routed,
        diagnostics={"forks": 1},
        metadata={"data_source": "shell", "nested": {"k": [1, 2.5, None]}},
        channel="train",
        reward=reward,
        reward_components={"correct": 1.0} if reward is not None else {},
        last_of_session=True,
    )


def step_segment(name: str, *steps: Step, **fields: Any) -> SegmentFinalized:
    """A segment of ``steps`` in order, each its context (loss mask 0, no logprob) then its
    completion (loss mask 1, logprobs from the engine); ``fields`` set any other field."""
    tokens: list[int] = []
    mask: list[int] = []
    lps: list[float] = []
    source: list[int] = []
    made: list[SegmentStep] = []
    for index, (context, completion, logprobs) in enumerate(steps):
        start = len(tokens)
        tokens += context + completion
        mask += [0] * len(context) + [1] * len(completion)
        lps += [0.0] * len(context) + logprobs
        source += [0] * len(context) + [1] * len(completion)
        made.append(
            SegmentStep(
                step_id=f"{name}-{index}",
                prompt_start=start,
                completion_start=start + len(context),
                completion_end=len(tokens),
                prefix="tito" if index else "rendered",
                finish_reason="length",
            )
        )
    values: dict[str, Any] = {
        "session_id": f"sess-{name}",
        "event_time": 0.0,
        "segment_id": f"seg-{name}",
        "chain_id": f"{name}-0",
        "token_ids": tokens,
        "loss_mask": mask,
        "logprobs": lps,
        "logprob_source": source,
        "steps": made,
        "finalize_reason": "finalized",
    }
    return SegmentFinalized(**{**values, **fields})


def token_segment(
    name: str,
    tokens: list[tuple[int, bool, float, int]],
    *,
    instance: str | None = None,
    session: str | None = None,
    last: bool = True,
    unused: bool = False,
    reward: float | None = None,
    metadata: dict[str, Any] | None = None,
    versions: list[VersionSpan] | None = None,
) -> SegmentFinalized:
    """A segment of ``tokens`` (id, in the loss, logprob, logprob source) as they are, no steps."""
    return SegmentFinalized(
        session_id=session or f"sess-{name}",
        event_time=0.0,
        segment_id=f"seg-{name}",
        chain_id=name,
        instance_id=instance,
        token_ids=[t[0] for t in tokens],
        loss_mask=[int(t[1]) for t in tokens],
        logprobs=[t[2] for t in tokens],
        # A token outside the loss may have no logprob (source 0), one in it always has one.
        logprob_source=[t[3] if t[1] else t[3] * (i % 2) for i, t in enumerate(tokens)],
        weight_versions=versions or [],
        steps=[],
        finalize_reason="finalized",
        last_of_session=last,
        unused_sample=unused,
        reward=reward,
        metadata=metadata or {},
    )


def block(start: int, values: np.ndarray) -> RoutedExperts:
    return RoutedExperts(
        start=start, shape=values.shape, dtype="uint8", data=values.astype("u1").tobytes()
    )
