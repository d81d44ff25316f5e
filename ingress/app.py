"""The ingress HTTP service: transport only. Each wire adapter brings its router; this module
wires the service, the session operations, discovery and health routes.

Invariants: every request is answered in its API's shape (a route's own errors by the route;
an unknown route, the wrong plane or a bug by :mod:`ingress.wire.errors`), and every session event
is published keyed by its session: its end (``session_ended``) and its budget
(``session_budgeted``) to the ended topic, all others to the steps topic."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from ingress.control.control_state import ControlState, PauseGate
from ingress.control.engine_driver import EngineDriver
from ingress.control.log_follower import LogFollower, control_log, ended_log
from ingress.control.pausable_engine import PausableEngine
from ingress.control.pool_control import apply_to_pool
from ingress.turns import metrics
from ingress.turns.budgets import SessionBudgets
from ingress.turns.chains import ChainStore
from ingress.turns.ended_sessions import EndedSessions
from ingress.turns.service import ChatService, ServiceOptions, SessionEvent
from ingress.turns.tracing import CallTracer
from ingress.wire import (
    admin_routes,
    anthropic_messages,
    openai_chat,
    openai_responses,
    session_routes,
    token_api,
)
from ingress.wire.errors import unexpected_error_response, unknown_route_response
from ingress.wire.hot_routes import HotRoutes
from ingress.wire.planes import PlaneSplit
from schemas.events import SessionBudgeted, SessionEnded, StepRecorded
from schemas.images import ImageProcessorFingerprint
from titoflow.bus import BrokerUnavailable, EventTooLarge, Publisher, ensure_topics
from titoflow.engine.groups import RoutingKeys
from titoflow.engine.pool import EnginePool
from titoflow.errors import PayloadTooLarge, PublishFailed
from titoflow.gc_pauses import freeze_startup, watch_full_collections
from titoflow.image_store import ImageStore
from titoflow.settings import Settings
from titoflow.shutdown import Deadline, close_budget
from titoflow.tito.image_grid import ImageProcessing
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer

log = logging.getLogger("titoflow.ingress")


def _unrecorded(
    exc: BrokerUnavailable | EventTooLarge, what: str, what_is: str
) -> PublishFailed | PayloadTooLarge:
    """The API's error for a publish the broker refused (counted): retryable when it was
    unavailable, a 413 when ``what`` was too large to record."""
    metrics.PUBLISH_FAILURES.inc()
    if isinstance(exc, EventTooLarge):
        return PayloadTooLarge(f"{what_is} too large to record: {exc}")
    return PublishFailed(f"{what} could not be recorded: {exc}")


def _image_options(
    settings: Settings,
) -> tuple[ImageProcessing | None, ImageProcessorFingerprint | None, ImageStore | None]:
    """The policy's image processing, its fingerprint (once, at start) and the image store;
    none of them for a text-only policy."""
    processing = ImageProcessing.of_model(settings.model_path)
    if processing is None:
        return None, None, None
    version = settings.engine_transformers_version
    if not version:
        log.warning(
            "the engines' transformers version is not known: images are recorded without it "
            "(set TITOFLOW_ENGINE_TRANSFORMERS_VERSION to the engines' version)"
        )
    return processing, processing.fingerprint(version), ImageStore(settings.image_store_dir)


def create_app(settings: Settings) -> FastAPI:
    publisher = Publisher(settings)
    pool = EnginePool.from_settings(settings)
    gate = PauseGate(ControlState(), settings.pause_hold_s)
    engine = PausableEngine(pool, gate)
    logs = LogFollower(settings)  # one consumer for both broadcast logs
    control = control_log(logs)
    ended = EndedSessions(settings.ended_sessions_kept)
    budgets = SessionBudgets(settings.ended_sessions_kept)
    routing = RoutingKeys(settings.engine_group_routing, settings.session_cache_size)
    ends = ended_log(logs)

    def follow_ended(event: SessionEnded | SessionBudgeted, offset: int) -> None:
        if isinstance(event, SessionBudgeted):
            budgets.record(event, offset)
            routing.opened(event.session_id, event.instance_id)
        else:
            ended.record(event, offset)

    ends.subscribe(follow_ended)
    control.subscribe(gate.apply)
    # Before the driver hears of an event: an engine just added is driven with the others.
    control.subscribe(lambda event, _offset: apply_to_pool(pool, event))
    driver = EngineDriver(gate.state, pool.engines)
    if settings.drive_engine:
        control.subscribe(lambda event, _offset: driver.notify(event))
    steps_topic, ended_topic = settings.topic("steps"), settings.topic("ended")

    async def publish(event: SessionEvent) -> None:
        started = time.perf_counter()
        topic = ended_topic if isinstance(event, SessionEnded | SessionBudgeted) else steps_topic
        try:
            await publisher.publish(topic, event.session_id, event.model_dump_json().encode())
        except (BrokerUnavailable, EventTooLarge) as exc:
            raise _unrecorded(exc, "the step", "the step is") from exc
        metrics.PUBLISH_SECONDS.observe(time.perf_counter() - started)

    async def publish_together(steps: Sequence[StepRecorded]) -> None:
        """The steps of one session's samples as one record batch: all recorded, or none."""
        started = time.perf_counter()
        values = [step.model_dump_json().encode() for step in steps]
        try:
            await publisher.publish_together(steps_topic, steps[0].session_id, values)
        except (BrokerUnavailable, EventTooLarge) as exc:
            raise _unrecorded(exc, "the steps", "the samples' steps are") from exc
        metrics.PUBLISH_SECONDS.observe(time.perf_counter() - started)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tokenizer = load_tokenizer(settings.model_path, settings.trust_remote_code)
        processing, fingerprint, store = _image_options(settings)
        app.state.settings = settings
        app.state.engines = pool
        app.state.publisher = publisher
        app.state.control_gate = gate
        app.state.service = ChatService(
            renderer=ChatRenderer.for_setting(tokenizer, settings.model_family),
            tokenizer=tokenizer,
            engine=engine,
            publish=publish,
            publish_together=publish_together,
            chains=ChainStore(settings.session_cache_size),
            options=ServiceOptions(
                max_model_len=settings.engine_max_model_len,
                default_max_tokens=settings.default_max_tokens,
                max_tokens_cap=settings.max_tokens_cap,
                context_policy=settings.context_policy,
                max_steps_per_session=settings.max_steps_per_session,
                matcher=settings.matcher,
                vocab_size=len(tokenizer),
                partial_rollout=settings.partial_rollout,
                max_in_flight=settings.max_in_flight,
                retry_after_s=settings.overload_retry_after_s,
                logprobs_mode=settings.engine_logprobs_mode,
                max_images=settings.max_images_per_request,
                max_image_bytes=settings.max_image_bytes_per_request,
                image_url_fetch=settings.image_url_fetch,
                image_url_timeout_s=settings.image_url_timeout_s,
                image_url_allowed_domains=settings.image_url_domains,
                image_url_max_redirects=settings.image_url_max_redirects,
                image_processing=processing,
                image_fingerprint=fingerprint,
                image_store=store,
            ),
            tracer=CallTracer(settings.otel_traces),
            control=gate,
            ended=ended,
            budgets=budgets,
            capacity=pool,
            routing=routing,
        )
        try:
            await ensure_topics(settings)  # before the producer's metadata request auto-creates
            await publisher.start()
        except BrokerUnavailable as exc:  # stateless: serve anyway, publishes retry the broker
            log.warning("broker not reachable at startup: %s", exc)
        pool.start()
        # Paused or not, the weight version, and which sessions may no longer end, before the
        # first request is admitted.
        await logs.start(settings.publish_timeout_s)
        tasks = [asyncio.create_task(logs.run())]
        if settings.drive_engine:
            tasks.append(asyncio.create_task(driver.run()))
        watch_full_collections()
        freeze_startup()  # the tokenizer, templates and app: out of every full collection's walk
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Each close bounded (aiokafka waits on a dead broker): an unflushed record was never
        # acknowledged, so no client got a 200 for it.
        closing = Deadline(close_budget(settings.shutdown_grace_s), log)
        await closing.run("stopping the control and ended-sessions log reader", logs.stop())
        await closing.run("flushing and closing the producer", publisher.stop())
        await closing.run("closing the engine clients", engine.close())

    app = FastAPI(title="titoflow ingress", lifespan=lifespan)
    turns = [api.router() for api in (openai_chat, anthropic_messages, openai_responses, token_api)]
    for routes in (*turns, session_routes.router()):
        app.include_router(routes)
    driver_routers = (session_routes.driver_router(), admin_routes.router())
    for routes in driver_routers:
        app.include_router(routes)
    # Added before the plane split, so inside it (the split decides first), and inside the
    # server-error handler (a bug answers as unexpected_error_response).
    app.add_middleware(HotRoutes, routes=[route for routes in turns for route in routes.routes])
    if settings.driver_port:
        app.add_middleware(
            PlaneSplit,
            driver_routes=[route for routes in driver_routers for route in routes.routes],
            driver_port=settings.driver_port,
        )

    app.add_exception_handler(StarletteHTTPException, unknown_route_response)
    app.add_exception_handler(Exception, unexpected_error_response)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready(request: Request) -> Response:
        loaded = hasattr(request.app.state, "service")
        broker_ok, engine_ok = await publisher.healthy(), await engine.healthy()
        status = 200 if loaded and broker_ok and engine_ok else 503
        body = {"tokenizer": loaded, "broker": broker_ok, "engine": engine_ok}
        return JSONResponse(body, status_code=status)

    return app
