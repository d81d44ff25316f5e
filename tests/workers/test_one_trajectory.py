"""One rollout, one trajectory segment: a client that samples ``n`` choices, retries a request or
starts several identical requests, and each time goes on with one of the answers, never going
back, is one trajectory plus one ``unused_sample`` segment per answer it did not go on with —
whatever the order the siblings reached the log in, and on a worker that re-read it.

Property tests straight into :class:`workers.assembler.Assembler`; the truth is the events: each
step's prompt is its parent's prompt and completion plus its own tail.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.events import SegmentFinalized, StepRecorded
from schemas.reasons import SplitReason
from tests.support.factories import recorded_step as step
from workers.assembler import Assembler

FIRST_PROMPT = [1, 2, 3]


@dataclass(frozen=True)
class Rollout:
    """Rounds of sibling steps; ``chosen[k]`` is the sibling of round ``k`` the client went on
    with (the last round's none: the session ended on it)."""

    rounds: list[list[StepRecorded]]
    chosen: list[str]
    prompts: dict[str, list[int]]

    def expected_last(self) -> str:
        """The documented pick when nobody went on: the sibling whose step id sorts first."""
        return min(s.step_id for s in self.rounds[-1])


@st.composite
def rollouts(draw: st.DrawFn) -> Rollout:
    ids = iter(draw(st.lists(st.text("0123456789abcdef", min_size=8, max_size=8), min_size=40,
                             max_size=40, unique=True)))  # fmt: skip
    tokens = st.lists(st.integers(10, 13), min_size=1, max_size=3)
    rounds: list[list[StepRecorded]] = []
    chosen: list[str] = []
    prompts: dict[str, list[int]] = {}
    parent: StepRecorded | None = None
    for _ in range(draw(st.integers(1, 5))):
        n = draw(st.integers(1, 4))
        tail = FIRST_PROMPT if parent is None else draw(tokens)
        prompt = (
            tail if parent is None else prompts[parent.step_id] + [*parent.completion_ids, *tail]
        )
        siblings = []
        for _ in range(n):
            sibling = step(
                next(ids),
                tail,
                draw(tokens),
                parent=parent.step_id if parent else None,
                prefix_len=len(prompt) - len(tail),
            )
            prompts[sibling.step_id] = prompt
            siblings.append(sibling)
        rounds.append(siblings)
        parent = draw(st.sampled_from(siblings))
        chosen.append(parent.step_id)
    return Rollout(rounds, chosen[:-1], prompts)


def delivered(rollout: Rollout, rng: random.Random) -> list[StepRecorded]:
    """The steps in a random order in which each comes after its parent (a slow sibling may
    reach the log after the fast one was continued)."""
    by_parent: dict[str | None, list[StepRecorded]] = {}
    for siblings in rollout.rounds:
        for sibling in siblings:
            by_parent.setdefault(sibling.parent_step_id, []).append(sibling)
    ready = list(by_parent.get(None, []))
    order: list[StepRecorded] = []
    while ready:
        taken = ready.pop(rng.randrange(len(ready)))
        order.append(taken)
        ready += by_parent.get(taken.step_id, [])
    return order


def finalize(events: list[StepRecorded]) -> list[SegmentFinalized]:
    assembler = Assembler()
    for offset, event in enumerate(events):
        assembler.add_step(event, partition=0, offset=offset)
    return assembler.finalize("s", "finalized")


def trainable_ids(segment: SegmentFinalized) -> list[int]:
    return [t for t, m in zip(segment.token_ids, segment.loss_mask, strict=True) if m]


@settings(max_examples=300, deadline=None)
@given(rollouts(), st.integers(0, 2**32 - 1))
def test_a_rollout_that_never_went_back_is_one_trajectory_plus_its_unused_samples(
    rollout: Rollout, seed: int
) -> None:
    rng = random.Random(seed)
    events = delivered(rollout, rng)
    segments = finalize(events)
    trajectory_steps = [*rollout.chosen, rollout.expected_last()]
    by_id = {s.step_id: s for siblings in rollout.rounds for s in siblings}

    [trajectory] = [s for s in segments if not s.unused_sample]
    assert trajectory.split_reason is None and trajectory.last_of_session
    assert [s.step_id for s in trajectory.steps] == trajectory_steps
    last = by_id[trajectory_steps[-1]]
    assert trajectory.token_ids == rollout.prompts[last.step_id] + list(last.completion_ids)
    assert trainable_ids(trajectory) == [
        t for step_id in trajectory_steps for t in by_id[step_id].completion_ids
    ]

    # One unused-sample segment per sibling nobody went on with, once, exact after its prompt.
    unused = [s for s in segments if s.unused_sample]
    left = {s.step_id for s in by_id.values()} - set(trajectory_steps)
    assert sorted(s.steps[-1].step_id for s in unused) == sorted(left)
    for segment in unused:
        sample = by_id[segment.steps[-1].step_id]
        assert segment.split_reason is SplitReason.FORK and not segment.last_of_session
        assert segment.token_ids == rollout.prompts[sample.step_id] + list(sample.completion_ids)
        assert trainable_ids(segment) == list(sample.completion_ids)

    # Another delivery order, or a worker re-reading the session, gives the same segments.
    again = finalize(delivered(rollout, random.Random(seed + 1)))

    def contents(found: list[SegmentFinalized]) -> list[tuple[object, ...]]:
        return sorted(
            (s.segment_id, s.token_ids, s.loss_mask, s.logprobs, s.unused_sample, s.split_reason)
            for s in found
        )

    assert contents(again) == contents(segments)
    assert [s.model_dump_json() for s in finalize(events)] == [
        s.model_dump_json() for s in segments
    ]


def test_a_real_fork_stays_a_fork() -> None:
    """The client went back to an earlier turn with a new message: two branches."""
    a = step("a", FIRST_PROMPT, [10])
    b = step("b", [4], [11], parent="a", prefix_len=4)
    c = step("c", [5], [12], parent="b", prefix_len=6)
    back = step("d", [6], [13], parent="a", prefix_len=4)  # another message after a
    first, fork = finalize([a, b, c, back])
    assert first.split_reason is None and trainable_ids(first) == [10, 11, 12]
    assert fork.split_reason is SplitReason.FORK and trainable_ids(fork) == [13]
    assert not first.unused_sample and not fork.unused_sample
