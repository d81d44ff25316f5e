"""Segments made by hand for the tests of what trainers read (exports, trainer formats): two
steps with a tool result between them, every field filled."""

from __future__ import annotations

from schemas.events import SegmentFinalized, SegmentStep, VersionSpan
from schemas.routed_experts import RoutedExperts


def make_segment(
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
