"""Several engines behind one :class:`~titoflow.engine.api.Engine`.

Routing: a session's steps go to the engine that ranks first for it by weighted rendezvous
(highest-random-weight) hashing of its routing key over the serving engines, so its prefix
stays in one engine's cache, and adding or draining an engine moves only the sessions that
ranked it first. The key the Engine protocol calls ``session_id`` is the session id, or with
group routing the instance id its group shares (titoflow/engine/groups.py): the group then
shares one engine's prefix cache, under the same fallback. Fallback, in the key's own ranking
order (a sticky second choice): past an engine that is unhealthy (a failed call, or a failed
``/health`` probe), or full (``max_in_flight`` or ``in_flight_limit`` calls in flight); when
every healthy engine is full, the least loaded one, unless it is at ``in_flight_limit``: then
the call is refused (:class:`~titoflow.errors.Overloaded`) before any engine sees it (the
ingress reserves its place earlier, :meth:`EnginePool.reserve`). A call that fails before the
engine produced anything (unreachable, 502/503/504) is retried on the next engine; a stream
that already yielded tokens is not.

Run time changes (:meth:`EnginePool.add`, :meth:`drain`, :meth:`remove`) are idempotent and
take effect at once (no await between them), so replaying them in order (a replica reading the
control log from the start, see ingress/control/pool_control.py) ends in the same pool. Drained
engines take no new calls, their in-flight calls finish, and their sessions' next steps go to
their next engine (a TITO step there: only the engine's prefix cache misses).
A removed engine is closed once its last call has finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterable, Sequence, Set
from dataclasses import dataclass
from typing import Protocol, TypeVar

from prometheus_client import Counter, Gauge

from schemas.control import Backend
from titoflow.engine.api import Engine, GenerateParams, Generation, GenerationChunk
from titoflow.engine.sglang import SGLangEngine
from titoflow.engine.vllm import VLLMEngine
from titoflow.errors import EngineUnavailable, Overloaded
from titoflow.settings import Settings

log = logging.getLogger("titoflow.engines")

BACKENDS: tuple[Backend, ...] = ("vllm", "sglang")

CALLS = Counter(
    "titoflow_engine_calls_total",
    "Generate calls per engine, by outcome: ok, unavailable (retried elsewhere when nothing "
    "was streamed yet), error (the engine refused the request), cancelled (the client left).",
    ["engine", "outcome"],
)
IN_FLIGHT = Gauge("titoflow_engine_in_flight", "Generate calls in flight per engine.", ["engine"])
HEALTHY = Gauge(
    "titoflow_engine_healthy", "1 when the engine's last probe or call succeeded.", ["engine"]
)
SERVING = Gauge(
    "titoflow_engine_serving",
    "1 when the engine takes new calls, 0 while it drains (removed engines have no series).",
    ["engine"],
)
FALLBACKS = Counter(
    "titoflow_engine_fallbacks_total",
    "Calls not served by the session's first-ranked engine, by why: unhealthy, overloaded, "
    "failed (that call failed and was retried).",
    ["reason"],
)


@dataclass(frozen=True)
class EngineSpec:
    url: str
    backend: Backend = "vllm"
    weight: float = 1.0  # share of sessions relative to the others (a canary takes e.g. 0.1)


def parse_engine_specs(settings: Settings) -> list[EngineSpec]:
    """``engine_url`` and the comma-separated ``engine_urls`` (``URL`` or ``BACKEND=URL``)."""
    specs: dict[str, EngineSpec] = {}
    entries = [settings.engine_url, *settings.engine_urls.split(",")]
    for entry in (e.strip() for e in entries):
        if not entry:
            continue
        head, named, tail = entry.partition("=")
        backend, url = (head, tail) if named else (settings.engine_backend, entry)
        if backend not in BACKENDS:
            raise ValueError(f"engine {entry!r}: backend must be one of {', '.join(BACKENDS)}")
        url = url.rstrip("/")
        specs[url] = EngineSpec(url, backend)
    return list(specs.values())


def make_engine(spec: EngineSpec, settings: Settings) -> Engine:
    if spec.backend == "sglang":
        experts = _experts_per_token(settings) if settings.engine_return_routed_experts else 0
        return SGLangEngine(spec.url, settings.engine_timeout_s, experts)
    return VLLMEngine(spec.url, settings.engine_timeout_s)


def _experts_per_token(settings: Settings) -> int:
    config = json.loads((settings.model_path / "config.json").read_text())
    return int(config.get("num_experts_per_tok") or 0)


def _nothing() -> None:
    return None


def rendezvous_score(session_id: str, url: str, weight: float) -> float:
    """Weighted HRW: each engine's share of sessions is proportional to its weight."""
    digest = hashlib.blake2b(f"{session_id}\0{url}".encode(), digest_size=8).digest()
    unit = (int.from_bytes(digest, "big") + 0.5) / 2**64  # in (0, 1)
    return -weight / math.log(unit)


class EngineLoad(Protocol):
    """What routing reads of an engine (the pool's members, :class:`EngineStatus`)."""

    @property
    def url(self) -> str: ...
    @property
    def weight(self) -> float: ...
    @property
    def serving(self) -> bool: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def in_flight(self) -> int: ...


Load = TypeVar("Load", bound=EngineLoad)


def _under(engine: EngineLoad, bound: int) -> bool:
    return not bound or engine.in_flight < bound


def rank(key: str, engines: Iterable[Load]) -> list[Load]:
    """The serving engines in ``key``'s order of preference (healthy or not); ``key`` is a
    session id, or a group's instance id (titoflow/engine/groups.py)."""
    serving = [e for e in engines if e.serving]
    return sorted(serving, key=lambda e: rendezvous_score(key, e.url, e.weight), reverse=True)


def choose(
    ranked: Sequence[Load], tried: Set[str], max_in_flight: int, in_flight_limit: int
) -> Load | None:
    """The engine a call goes to, given its key's ranking and the engines it failed on: the
    first healthy one with room (under ``max_in_flight`` and ``in_flight_limit``), else the
    least loaded healthy one; None when that one is at ``in_flight_limit`` (every healthy
    engine is: the call is refused). Unhealthy engines are tried, in order, only when no
    untried one is healthy (a call is the freshest probe)."""
    if not ranked:
        raise EngineUnavailable("no engine is serving (all drained or removed)")
    untried = [e for e in ranked if e.url not in tried]
    healthy = [e for e in untried if e.healthy]
    if not healthy:
        if not untried:
            raise EngineUnavailable("every serving engine failed this call")
        return untried[0]
    idle = [e for e in healthy if _under(e, max_in_flight) and _under(e, in_flight_limit)]
    chosen = idle[0] if idle else min(healthy, key=lambda e: e.in_flight)
    if in_flight_limit and chosen.in_flight >= in_flight_limit:
        return None
    return chosen


@dataclass
class _Member:
    spec: EngineSpec
    engine: Engine
    serving: bool = True
    healthy: bool = True
    removed: bool = False
    in_flight: int = 0

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def weight(self) -> float:
        return self.spec.weight


@dataclass
class _Attempt:
    """One try of a call: the engine it went to, and whether any of its answer went out (a
    streamed chunk), after which the call cannot move to another engine."""

    member: _Member
    answered: bool = False


@dataclass(frozen=True)
class EngineStatus:
    url: str
    backend: Backend
    weight: float
    serving: bool
    healthy: bool
    in_flight: int


class EnginePool:
    url = "pool"

    def __init__(
        self,
        specs: list[EngineSpec],
        make: Callable[[EngineSpec], Engine],
        max_in_flight: int = 0,
        health_interval_s: float = 5.0,
        in_flight_limit: int = 0,
        retry_after_s: int = 1,
    ) -> None:
        self._make = make
        self.max_in_flight = max_in_flight
        self.in_flight_limit = in_flight_limit
        self.retry_after_s = retry_after_s
        self.reserved = 0  # calls admitted against in_flight_limit (see reserve)
        self.health_interval_s = health_interval_s
        self._members: dict[str, _Member] = {}
        self._health_task: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()  # clients of removed engines
        for spec in specs:
            self.add(spec)

    @classmethod
    def from_settings(cls, settings: Settings) -> EnginePool:
        return cls(
            parse_engine_specs(settings),
            lambda spec: make_engine(spec, settings),
            settings.engine_max_in_flight,
            settings.engine_health_interval_s,
            settings.engine_in_flight_limit,
            settings.overload_retry_after_s,
        )

    # --- run-time changes -------------------------------------------------------------------

    def add(self, spec: EngineSpec) -> None:
        """Add an engine, or put a draining one back into service (with ``spec``'s weight)."""
        member = self._members.get(spec.url)
        if member is not None and member.spec.backend != spec.backend:
            log.warning(
                "engine %s is already a %s engine; not added", spec.url, member.spec.backend
            )
            return
        if member is None:
            member = _Member(spec, self._make(spec))
            self._members[spec.url] = member
            HEALTHY.labels(spec.url).set(1)
            IN_FLIGHT.labels(spec.url).set(0)
        member.spec, member.serving = spec, True
        SERVING.labels(spec.url).set(1)
        log.info("engine serving", extra={"engine": spec.url, "backend": spec.backend})

    def drain(self, url: str) -> None:
        """No new calls go to ``url``; calls in flight there finish."""
        member = self._members.get(url.rstrip("/"))
        if member is None:
            log.warning("drain of unknown engine %s ignored", url)
            return
        member.serving = False
        SERVING.labels(member.url).set(0)
        log.info("engine draining", extra={"engine": member.url, "in_flight": member.in_flight})

    def remove(self, url: str) -> None:
        """Drain ``url`` and forget it at once; its client closes once its last call finished
        (needs a running event loop when no call is in flight there: the close is a task)."""
        member = self._members.pop(url.rstrip("/"), None)
        if member is None:
            log.warning("removal of unknown engine %s ignored", url)
            return
        member.serving, member.removed = False, True
        for gauge in (SERVING, HEALTHY, IN_FLIGHT):
            with contextlib.suppress(KeyError):
                gauge.remove(member.url)
        log.info("engine removed", extra={"engine": member.url, "in_flight": member.in_flight})
        if member.in_flight == 0:
            closing = asyncio.get_running_loop().create_task(member.engine.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    def engines(self) -> list[Engine]:
        """Every engine of the pool, draining ones included (the control plane drives them)."""
        return [m.engine for m in self._members.values()]

    def status(self) -> list[EngineStatus]:
        return [
            EngineStatus(m.url, m.spec.backend, m.spec.weight, m.serving, m.healthy, m.in_flight)
            for m in self._members.values()
        ]

    # --- routing ----------------------------------------------------------------------------

    def ranking(self, session_id: str) -> list[str]:
        """The serving engines in the order of preference of ``session_id``, a routing key
        (healthy or not)."""
        return [m.url for m in self._ranked(session_id)]

    def _ranked(self, session_id: str) -> list[_Member]:
        return rank(session_id, self._members.values())

    def _choose(self, session_id: str, tried: set[str]) -> _Member:
        ranked = self._ranked(session_id)
        chosen = choose(ranked, tried, self.max_in_flight, self.in_flight_limit)
        if chosen is None:
            raise self._overloaded_error()
        first = ranked[0]
        if chosen is not first:
            reason = (
                "failed"
                if first.url in tried
                else "unhealthy"
                if not first.healthy
                else "overloaded"
            )
            FALLBACKS.labels(reason).inc()
        return chosen

    def reserve(self) -> Callable[[], None]:
        """A place for one call among the engines' ``in_flight_limit`` (all healthy serving
        engines' together), taken when the ingress admits the call, before it renders, and
        released by calling the result when the call ended; refused (:class:`Overloaded`)
        when every place is taken. Reserving before the engine is picked is what keeps
        concurrent admissions from overshooting (a stream refused after its status line); the
        choice of an engine still refuses one at its limit, the last word."""
        limit = self.in_flight_limit
        if not limit:
            return _nothing
        healthy = sum(1 for m in self._members.values() if m.serving and m.healthy)
        if self.reserved >= limit * max(healthy, 1):
            raise self._overloaded_error()
        self.reserved += 1
        return self._unreserve

    def _unreserve(self) -> None:
        self.reserved -= 1

    def _overloaded_error(self) -> Overloaded:
        return Overloaded(
            f"every engine has {self.in_flight_limit} calls in flight, their bound "
            "(TITOFLOW_ENGINE_IN_FLIGHT_LIMIT): retry after the Retry-After seconds",
            "engine",
            self.retry_after_s,
        )

    def _enter(self, member: _Member) -> None:
        member.in_flight += 1
        if not member.removed:
            IN_FLIGHT.labels(member.url).set(member.in_flight)

    async def _leave(self, member: _Member, outcome: str) -> None:
        member.in_flight -= 1
        CALLS.labels(member.url, outcome).inc()
        if member.removed:
            if member.in_flight == 0:
                await member.engine.close()
            return
        IN_FLIGHT.labels(member.url).set(member.in_flight)
        if outcome in ("ok", "unavailable"):
            self._mark(member, outcome == "ok")

    def _mark(self, member: _Member, healthy: bool) -> None:
        if member.healthy != healthy:
            log.warning(
                "engine %s", "healthy" if healthy else "unhealthy", extra={"engine": member.url}
            )
        member.healthy = healthy
        if not member.removed:
            HEALTHY.labels(member.url).set(int(healthy))

    # --- the Engine protocol ----------------------------------------------------------------

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> Generation:
        tried: set[str] = set()
        while True:
            async with self._attempt(session_id, tried) as attempt:
                return await attempt.member.engine.generate(
                    prompt_ids, params, request_id, session_id=session_id
                )

    async def generate_stream(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> AsyncIterator[GenerationChunk]:
        tried: set[str] = set()
        while True:
            async with self._attempt(session_id, tried) as attempt:
                async for chunk in attempt.member.engine.generate_stream(
                    prompt_ids, params, request_id, session_id=session_id
                ):
                    attempt.answered = True
                    yield chunk
                return

    @contextlib.asynccontextmanager
    async def _attempt(self, session_id: str, tried: set[str]) -> AsyncIterator[_Attempt]:
        """One try of a call on the engine chosen for ``session_id`` among those not ``tried``,
        counted in and out with its outcome. Where that engine is unavailable, it joins
        ``tried`` and the error is swallowed, for the caller to try again, while another engine
        may take the call and nothing of this one's answer went out."""
        attempt = _Attempt(self._choose(session_id, tried))
        self._enter(attempt.member)
        outcome = "cancelled"
        try:
            yield attempt
            outcome = "ok"
        except EngineUnavailable:
            outcome = "unavailable"
            tried.add(attempt.member.url)
            if attempt.answered or not self._has_other(session_id, tried):
                raise
        except Exception:
            outcome = "error"
            raise
        finally:
            await self._leave(attempt.member, outcome)

    def _has_other(self, session_id: str, tried: set[str]) -> bool:
        return any(m.url not in tried for m in self._ranked(session_id))

    async def healthy(self) -> bool:
        """Whether any serving engine answers its health probe."""
        await self.probe()
        return any(m.healthy for m in self._members.values() if m.serving)

    async def probe(self) -> None:
        members = list(self._members.values())
        results = await asyncio.gather(*(m.engine.healthy() for m in members))
        for member, ok in zip(members, results, strict=True):
            self._mark(member, ok)

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            try:
                await self.probe()
            except Exception:  # a probe bug must not stop the probing
                log.exception("engine health probe failed")

    def start(self) -> None:
        """Start the periodic health probes (needs a running event loop)."""
        if self._health_task is None:
            self._health_task = asyncio.get_running_loop().create_task(self._probe_forever())

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            self._health_task = None
        for member in list(self._members.values()):
            await member.engine.close()
        await asyncio.gather(*self._closing)
