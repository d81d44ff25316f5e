"""The rollout driver's client: open sessions, finalize them with a reward (or discard them),
and await each session's segments from the segments topic. A group rollout in a few lines::

    async with RolloutClient(ingress_url, settings) as rollouts:
        opened = [await rollouts.open(instance_id="prompt-17", channel="train") for _ in range(8)]
        ...  # run a scaffold per session on opened[i].openai_base_url
        await rollouts.finalize(opened[i].session_id, reward=1.0)
        segments = await rollouts.segments(opened[i].session_id, timeout_s=120)

Segments are read with the trainer's own :class:`~titoflow.client.consumer.SegmentConsumer` (no
consumer group, from the end of the topic at ``__aenter__``; repeats dropped), so a client sees the
sessions it opened and any other it asks about before they finish.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from schemas.events import SegmentFinalized, SessionDiscarded
from titoflow.client.consumer import SegmentConsumer
from titoflow.settings import Settings


class RolloutError(Exception):
    """The ingress refused a session operation (its status and error body)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"ingress answered {status}: {body}")
        self.status = status
        self.body = body


class SessionAlreadyEnded(RolloutError):
    """A finalize or discard of a session that had already ended (409): ``how`` (finalized,
    discarded or idle) and ``at`` (unix seconds) say how the end that stands happened."""

    def __init__(self, status: int, body: str, how: str, at: float) -> None:
        super().__init__(status, body)
        self.how = how
        self.at = at


@dataclass(frozen=True)
class OpenedSession:
    session_id: str
    instance_id: str | None
    channel: str | None
    openai_base_url: str  # for OpenAI-style clients (base_url=...)
    anthropic_base_url: str  # for Anthropic-style clients (base_url=...)
    generate_url: str  # the white-box token API
    api_key: str = ""  # what the scaffold sends as its API key (the session's own key)


class RolloutClient:
    def __init__(self, ingress_url: str, settings: Settings, http_timeout_s: float = 30.0) -> None:
        self._url = ingress_url.rstrip("/")
        driver = {"authorization": f"Bearer {settings.driver_token}"}
        self._http = httpx.AsyncClient(
            timeout=http_timeout_s, headers=driver if settings.driver_token else None
        )
        self._consumer = SegmentConsumer(settings, group_id=None, from_end=True)
        self._segments: defaultdict[str, list[SegmentFinalized]] = defaultdict(list)
        self._notices: dict[str, SessionDiscarded] = {}
        self._done: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RolloutClient:
        await self._consumer.__aenter__()
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await self._consumer.__aexit__(exc_type, exc, tb)
        await self._http.aclose()

    def _track(self, session_id: str) -> asyncio.Event:
        """Collect the session's segments from now on; set once they are all in."""
        return self._done[session_id]

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self._http.post(f"{self._url}{path}", json=body)
        if response.status_code == 409 and "session_ended" in response.text:
            ended = response.json()["error"]["ended"]
            raise SessionAlreadyEnded(409, response.text, ended["how"], ended["at"])
        if response.status_code != 200:
            raise RolloutError(response.status_code, response.text)
        answer: dict[str, Any] = response.json()
        return answer

    async def ended(self, session_id: str) -> tuple[str, float] | None:
        """How and when the session ended, as far as the ingress knows: ``(how, at)`` or None."""
        response = await self._http.get(f"{self._url}/v1/sessions/{session_id}")
        if response.status_code != 200:
            raise RolloutError(response.status_code, response.text)
        ended = response.json()["ended"]
        return None if ended is None else (ended["how"], ended["at"])

    async def open(
        self,
        instance_id: str | None = None,
        channel: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        budget: Mapping[str, float] | None = None,
        sampling: Mapping[str, Any] | None = None,
    ) -> OpenedSession:
        """Open a session (``SessionOpened`` is durable when this returns). ``budget``: limits
        on its model calls, ``turns``, ``tokens`` and ``wall_s``; ``sampling``: overrides of
        what its scaffold asks, ``temperature``, ``top_p``, ``top_k``, ``max_tokens`` (a cap),
        ``seed`` and ``seed_policy`` (docs/api.md)."""
        body: dict[str, Any] = {
            "instance_id": instance_id,
            "channel": channel,
            "metadata": dict(metadata or {}),
            "options": dict(options or {}),
            "budget": dict(budget or {}),
            "sampling": dict(sampling or {}),
        }
        if session_id is not None:
            body["session_id"] = session_id
        answer = await self._post("/v1/sessions", body)
        self._track(answer["session_id"])
        return OpenedSession(
            session_id=answer["session_id"],
            instance_id=answer["instance_id"],
            channel=answer["channel"],
            openai_base_url=answer["openai_base_url"],
            anthropic_base_url=answer["anthropic_base_url"],
            generate_url=answer["generate_url"],
            api_key=answer.get("api_key", ""),
        )

    async def finalize(
        self,
        session_id: str,
        reward: float | Mapping[str, float] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Declare the session done; its segments carry ``reward`` (a number, or named ones)."""
        self._track(session_id)
        value = dict(reward) if isinstance(reward, Mapping) else reward
        body = {"reward": value, "metadata": dict(metadata or {})}
        await self._post(f"/sess/{session_id}/finalize", body)

    async def discard(self, session_id: str, metadata: Mapping[str, Any] | None = None) -> None:
        """Abort the session: workers finalize nothing and publish a discard notice."""
        self._track(session_id)
        await self._post(f"/sess/{session_id}/discard", {"metadata": dict(metadata or {})})

    async def segments(self, session_id: str, timeout_s: float) -> list[SegmentFinalized]:
        """The session's segments once its last one arrived; ``[]`` if it yielded none
        (:meth:`notice` says why). Raises TimeoutError after ``timeout_s``."""
        done = self._track(session_id)
        if self._reader is None:
            raise RuntimeError("use RolloutClient in an async with block")
        waiter = asyncio.ensure_future(done.wait())
        try:
            finished, _ = await asyncio.wait(
                {waiter, self._reader}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiter.cancel()
        if self._reader in finished:
            self._reader.result()  # the reader failed: raise its error here
        if waiter not in finished:
            raise TimeoutError(f"no segments of session {session_id} within {timeout_s}s")
        del self._done[session_id]
        return self._segments.pop(session_id, [])

    def notice(self, session_id: str) -> SessionDiscarded | None:
        """Why a session yielded no segment (``reason``: discarded or empty), once known."""
        return self._notices.get(session_id)

    async def _read(self) -> None:
        async for record in self._consumer.records():
            session_id = record.session_id
            if session_id not in self._done:
                continue  # nobody waits for it
            if isinstance(record, SessionDiscarded):
                self._notices[session_id] = record
                self._done[session_id].set()
                continue
            self._segments[session_id].append(record)
            if record.last_of_session:
                self._done[session_id].set()
