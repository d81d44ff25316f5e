"""SCRIPTED ENGINE DOUBLE — for fast unit tests only. It returns the token ids of texts a test
scripts, with made-up logprobs. Nothing an issue asks to show rests on it: those tests run the
real vLLM CPU engine (see tests/test_e2e_openai.py)."""

from __future__ import annotations

from collections import deque
from typing import Any

from schemas.events import SessionFinalized, StepRecorded
from titoflow.engine import GenerateParams, Generation


class ScriptedEngine:
    url = "scripted://double"

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer = tokenizer
        self.replies = deque(replies)
        self.prompts: list[list[int]] = []

    async def generate(
        self, prompt_ids: list[int], params: GenerateParams, request_id: str
    ) -> Generation:
        self.prompts.append(list(prompt_ids))
        ids = self.tokenizer.encode(self.replies.popleft(), add_special_tokens=False)
        ids = ids[: params.max_tokens]
        stopped = bool(ids) and ids[-1] in params.stop_token_ids
        return Generation(
            token_ids=ids,
            logprobs=[-0.25 - i / 64 for i in range(len(ids))],
            finish_reason="stop" if stopped else "length",
            request_id=request_id,
            engine_url=self.url,
        )

    async def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        return None


class RecordingPublisher:
    """Stands in for the broker: records events, or fails like a broker that is down."""

    def __init__(self) -> None:
        self.events: list[StepRecorded | SessionFinalized] = []
        self.fail_next = False

    async def __call__(self, event: StepRecorded | SessionFinalized) -> None:
        if self.fail_next:
            self.fail_next = False
            from titoflow.errors import PublishFailed

            raise PublishFailed("broker down (scripted)")
        self.events.append(event)
