"""The driver plane on the real stack (ingress process, tansu, vLLM CPU, worker): with a driver
token set, agent code holding only its session's base URL and API key cannot grade itself, end
its own or another session, or open sessions; nothing it tries reaches the steps topic. The
driver's own finalize sets the reward the trainer sees. A session ends once, on every replica,
and a scaffold still calling it is told so."""

from __future__ import annotations

import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai import AsyncOpenAI

from cli.dev.procs import free_port
from cli.dev.stack import start_ingress, start_worker
from cli.up import DRIVER_TOKEN_FILE, write_driver_token
from schemas.events import (
    SessionDiscarded,
    SessionFinalized,
    SessionOpened,
    StepRecorded,
    ended_adapter,
    steps_topic_adapter,
)
from tests.support.apps import until
from tests.support.topics import read_all
from titoflow.client.rollout import RolloutClient, SessionAlreadyEnded
from titoflow.settings import Settings

pytestmark = pytest.mark.engine

DRIVER_TOKEN = "driver-" + uuid.uuid4().hex
AGENT_KEY = "sk-agent-held-key"


async def test_an_agent_holding_its_base_url_cannot_reach_the_driver_plane(
    stack_settings: Settings, tmp_path: Path
) -> None:
    settings = stack_settings.model_copy(update={"driver_token": DRIVER_TOKEN})
    ingress, url = start_ingress(settings, tmp_path)
    worker = start_worker(settings, tmp_path)
    answers: dict[str, tuple[int, str]] = {}
    try:
        async with RolloutClient(url, settings) as driver:
            opened = await driver.open(instance_id="task-1", metadata={"source": "driver"})
            other = await driver.open(instance_id="task-2")
            session, base = opened.session_id, opened.openai_base_url
            agent = AsyncOpenAI(base_url=base, api_key=AGENT_KEY, max_retries=0)
            await agent.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=8
            )
            await agent.close()
            root = base.removesuffix("/v1")
            attempts: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
                "finalize with a reward": (f"{root}/finalize", {"reward": 1.0}, {}),
                "finalize without one": (f"{root}/finalize", {}, {}),
                "discard its own": (f"{root}/discard", {}, {}),
                "discard another": (f"{url}/sess/{other.session_id}/discard", {}, {}),
                "finalize by header": (f"{url}/finalize", {}, {"x-session-id": session}),
                "finalize by body": (f"{url}/finalize", {"session_id": session}, {}),
                "open a session": (f"{url}/v1/sessions", {"session_id": "agent-made"}, {}),
                "reach control": (f"{url}/admin/control", {"command": "pause"}, {}),
                # httpx resolves the dots: this is the session's finalize again.
                "traverse a path": (f"{base}/../finalize", {"reward": 1.0}, {}),
            }
            agent_headers = {"authorization": f"Bearer {AGENT_KEY}"}
            async with httpx.AsyncClient() as http:
                for name, (target, body, extra) in attempts.items():
                    answer = await http.post(
                        target,
                        json={**body, "metadata": {"graded_by": "agent"}},
                        headers={**agent_headers, **extra},
                    )
                    answers[name] = (answer.status_code, answer.text)
            await driver.finalize(session, reward=0.25, metadata={"graded_by": "driver"})
            await driver.discard(other.session_id)
            segments = await driver.segments(session, timeout_s=120)
    finally:
        ingress.stop()
        worker.stop()

    for name, (status, text) in answers.items():
        assert status in (401, 403, 404), f"{name}: {status} {text}"
        assert '"error"' in text, f"{name}: not in the API's error shape: {text}"
    assert answers["finalize with a reward"][0] == 401
    assert answers["open a session"][0] == 401
    events = await read_all(settings, settings.topic("steps"), steps_topic_adapter)
    ours = [e for e in events if e.session_id in (session, other.session_id, "agent-made")]
    kinds = [type(e) for e in ours]
    # The driver's two opens, the agent's one call, the driver's finalize and discard: nothing
    # the agent tried was published.
    assert kinds.count(SessionOpened) == 2 and kinds.count(StepRecorded) == 1
    [finalized] = [e for e in ours if isinstance(e, SessionFinalized)]
    assert finalized.reward == 0.25 and finalized.metadata == {"graded_by": "driver"}
    assert [e.session_id for e in ours if isinstance(e, SessionDiscarded)] == [other.session_id]
    [segment] = segments
    assert segment.reward == 0.25 and segment.metadata["graded_by"] == "driver"


def test_up_writes_its_driver_token_privately(tmp_path: Path) -> None:
    """(That `up` makes a fresh one: tests/cli/test_cli.py.)"""
    path = tmp_path / "run" / DRIVER_TOKEN_FILE
    write_driver_token(tmp_path / "run", "first")
    assert path.read_text().strip() == "first"
    assert path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o644)
    write_driver_token(tmp_path / "run", "second")
    assert path.read_text().strip() == "second"
    assert path.stat().st_mode & 0o777 == 0o600


async def test_with_implicit_sessions_off_a_session_key_opens_that_session_only(
    stack_settings: Settings, tmp_path: Path
) -> None:
    settings = stack_settings.model_copy(
        update={"driver_token": DRIVER_TOKEN, "implicit_sessions": False}
    )
    ingress, url = start_ingress(settings, tmp_path)
    request: dict[str, Any] = {
        "model": "policy",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    }
    answers: dict[str, int] = {}
    try:
        async with RolloutClient(url, settings) as driver:
            mine = await driver.open(instance_id="task-1")
            theirs = await driver.open(instance_id="task-2")
        assert mine.api_key and mine.api_key != theirs.api_key
        agent = AsyncOpenAI(base_url=mine.openai_base_url, api_key=mine.api_key, max_retries=0)
        await agent.chat.completions.create(**request)  # its own key, its own session: served
        await agent.close()
        claude = anthropic.AsyncAnthropic(
            base_url=mine.anthropic_base_url, api_key=mine.api_key, max_retries=0
        )
        await claude.messages.create(
            model="policy", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
        await claude.close()
        key = {"authorization": f"Bearer {mine.api_key}"}
        chat = "/v1/chat/completions"
        attempts: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
            "no key": (f"{mine.openai_base_url}{chat.removeprefix('/v1')}", request, {}),
            "a made-up key": (
                f"{mine.openai_base_url}/chat/completions",
                request,
                {"authorization": "Bearer sk-guess"},
            ),
            "another session's URL": (f"{theirs.openai_base_url}/chat/completions", request, key),
            "another session by header": (
                f"{url}{chat}",
                request,
                {**key, "x-session-id": theirs.session_id},
            ),
            "another session by body": (
                f"{url}{chat}",
                {**request, "session_id": theirs.session_id},
                key,
            ),
            "its own by header, another by body": (
                f"{url}{chat}",
                {**request, "session_id": theirs.session_id},
                {**key, "x-session-id": mine.session_id},
            ),
            "an unopened session": (f"{url}/sess/nobody/v1/chat/completions", request, key),
        }
        async with httpx.AsyncClient(timeout=60) as http:
            for name, (target, body, headers) in attempts.items():
                answer = await http.post(target, json=body, headers=headers)
                answers[name] = answer.status_code
                assert '"error"' in answer.text, name
            by_header = await http.post(
                f"{url}{chat}", json=request, headers={**key, "x-session-id": mine.session_id}
            )
            assert by_header.status_code == 200, by_header.text
            # On its own URL, a header naming another session moves nothing: the path names the
            # session (scaffolds send such headers of their own, e.g. OpenCode's x-session-id).
            own_url = await http.post(
                f"{mine.openai_base_url}/chat/completions",
                json=request,
                headers={**key, "x-session-id": theirs.session_id},
            )
            assert own_url.status_code == 200, own_url.text
    finally:
        ingress.stop()
    assert answers == {
        "no key": 401,
        "a made-up key": 401,
        "another session's URL": 401,
        "another session by header": 401,
        "another session by body": 401,
        "its own by header, another by body": 403,
        "an unopened session": 401,
    }
    events = await read_all(settings, settings.topic("steps"), steps_topic_adapter)
    steps = [e for e in events if isinstance(e, StepRecorded)]
    assert [s.session_id for s in steps] == [mine.session_id] * 4  # the four served calls


async def refusals(ends: dict[str, Coroutine[Any, Any, None]]) -> dict[str, SessionAlreadyEnded]:
    """Each named end, awaited: each must be refused as a session already ended."""
    refused: dict[str, SessionAlreadyEnded] = {}
    for name, end in ends.items():
        with pytest.raises(SessionAlreadyEnded) as caught:
            await end
        refused[name] = caught.value
    return refused


async def scaffold_calls(session_root: str) -> list[tuple[int, str, str]]:
    """An OpenAI chat call and an Anthropic messages call on a session's URLs: for each, the
    refusal's status, its code (OpenAI) or error type (Anthropic), and its message."""
    answers: list[tuple[int, str, str]] = []
    gpt = AsyncOpenAI(base_url=f"{session_root}/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.APIStatusError) as refused:
        await gpt.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "more"}], max_tokens=4
        )
    await gpt.close()
    answers.append((refused.value.status_code, str(refused.value.code), refused.value.message))
    claude = anthropic.AsyncAnthropic(base_url=session_root, api_key="k", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as denied:
        await claude.messages.create(
            model="policy", messages=[{"role": "user", "content": "more"}], max_tokens=4
        )
    await claude.close()
    error = denied.value.body["error"]  # type: ignore[index]
    answers.append((denied.value.status_code, error["type"], error["message"]))
    return answers


async def test_a_session_ends_once_on_every_replica_and_says_how(
    stack_settings: Settings, tmp_path: Path
) -> None:
    settings = stack_settings.model_copy(
        update={"driver_token": DRIVER_TOKEN, "idle_finalize_s": 3.0}
    )
    first, first_url = start_ingress(settings, tmp_path, "ingress-a")
    second, second_url = start_ingress(settings, tmp_path, "ingress-b")
    worker = start_worker(settings, tmp_path)
    refused: dict[str, SessionAlreadyEnded] = {}
    answers: dict[str, list[tuple[int, str, str]]] = {}
    try:
        async with (
            RolloutClient(first_url, settings) as driver,
            RolloutClient(second_url, settings) as elsewhere,
        ):
            done, dropped, idle = [await driver.open(instance_id=f"t{i}") for i in range(3)]
            for opened in (done, dropped, idle):
                agent = AsyncOpenAI(base_url=opened.openai_base_url, api_key="k", max_retries=0)
                await agent.chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
                await agent.close()
            await driver.finalize(done.session_id, reward=1.0, metadata={"graded_by": "driver"})
            await driver.discard(dropped.session_id)
            # The replica that ended them knows at once ...
            refused |= await refusals(
                {
                    "finalize twice": driver.finalize(done.session_id, reward=0.0),
                    "discard after finalize": driver.discard(done.session_id),
                    "finalize after discard": driver.finalize(dropped.session_id, reward=1.0),
                }
            )
            # ... every other one once it has followed <prefix>.ended; a worker's idle end too.
            ended_elsewhere = [(elsewhere, done), (elsewhere, dropped), (elsewhere, idle)]
            for client, session in [*ended_elsewhere, (driver, idle)]:

                async def known(
                    client: RolloutClient = client, sid: str = session.session_id
                ) -> bool:
                    return await client.ended(sid) is not None

                await until(known, f"the end of {session.session_id} known", 60.0)
            refused |= await refusals(
                {
                    "finalize twice, elsewhere": elsewhere.finalize(done.session_id, reward=0.0),
                    "finalize after discard, elsewhere": elsewhere.finalize(dropped.session_id),
                    "finalize after idle": driver.finalize(idle.session_id, reward=1.0),
                }
            )
            # A scaffold still calling an ended session is told so, on either replica, in its
            # API's own shape; the engine is not called and nothing is recorded.
            for replica in (first_url, second_url):
                for session in (done, dropped, idle):
                    answers[f"{replica} {session.session_id}"] = await scaffold_calls(
                        f"{replica}/sess/{session.session_id}"
                    )
            [graded] = await driver.segments(done.session_id, timeout_s=120)
            [timed_out] = await driver.segments(idle.session_id, timeout_s=120)
    finally:
        first.stop()
        second.stop()
        worker.stop()

    assert {name: error.how for name, error in refused.items()} == {
        "finalize twice": "finalized",
        "discard after finalize": "finalized",
        "finalize after discard": "discarded",
        "finalize twice, elsewhere": "finalized",
        "finalize after discard, elsewhere": "discarded",
        "finalize after idle": "idle",
    }
    assert "finalized by the rollout driver at" in refused["finalize twice"].body
    assert len(answers) == 6
    for where, calls in answers.items():
        how = "discarded" if dropped.session_id in where else "finalized"
        how = "worker after its idle timeout" if idle.session_id in where else how
        assert [(status, kind) for status, kind, _ in calls] == [
            (409, "session_ended"),
            (409, "invalid_request_error"),
        ], where
        assert all(how in message for _, _, message in calls), (where, calls)
    # The first end stands, with the driver's reward; the idle one has none and says so.
    assert (graded.finalize_reason, graded.reward, graded.metadata["graded_by"]) == (
        "finalized",
        1.0,
        "driver",
    )
    assert (timed_out.finalize_reason, timed_out.reward) == ("idle", None)
    # Nothing refused was published: one end per session on the steps log and on the ended log.
    ours = {done.session_id, dropped.session_id, idle.session_id}
    events = await read_all(settings, settings.topic("steps"), steps_topic_adapter)
    ends = [type(e).__name__ for e in events if e.session_id in ours and e.type != "step_recorded"]
    assert sorted(ends) == ["SessionDiscarded", "SessionFinalized", *["SessionOpened"] * 3]
    steps = [e.session_id for e in events if e.session_id in ours and e.type == "step_recorded"]
    assert sorted(steps) == sorted(ours)  # each session's one call before its end, no other
    logged = await read_all(settings, settings.topic("ended"), ended_adapter)
    assert {
        e.session_id: e.how for e in logged if e.session_id in ours and e.type == "session_ended"
    } == {
        done.session_id: "finalized",
        dropped.session_id: "discarded",
        idle.session_id: "idle",
    }
    assert len([e for e in logged if e.session_id in ours]) == 3


async def test_on_its_own_listener_the_driver_plane_does_not_exist_for_scaffolds(
    stack_settings: Settings, tmp_path: Path
) -> None:
    """``driver_port`` set: the scaffold listener has no driver routes, even for a caller that
    holds the driver token, and the driver listener serves nothing a scaffold needs."""
    driver_port = free_port("127.0.0.1")
    settings = stack_settings.model_copy(
        update={"driver_token": DRIVER_TOKEN, "driver_port": driver_port}
    )
    ingress, url = start_ingress(settings, tmp_path)
    driver_url = settings.driver_url(url)
    assert driver_url == f"http://127.0.0.1:{driver_port}"
    worker = start_worker(settings, tmp_path)
    chat: dict[str, Any] = {
        "model": "policy",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    }
    token = {"authorization": f"Bearer {DRIVER_TOKEN}"}
    try:
        async with RolloutClient(driver_url, settings) as driver:
            opened = await driver.open(instance_id="task-1")
            session = opened.session_id
            # The scaffold's URLs name the scaffold listener; the driver's stay on its own.
            assert opened.openai_base_url == f"{url}/sess/{session}/v1"
            async with httpx.AsyncClient(timeout=60) as http:
                served = await http.post(f"{opened.openai_base_url}/chat/completions", json=chat)
                assert served.status_code == 200, served.text
                on_scaffold = {
                    "open": ("POST", f"{url}/v1/sessions", {}),
                    "finalize": ("POST", f"{url}/sess/{session}/finalize", {"reward": 1.0}),
                    "finalize by header": ("POST", f"{url}/finalize", {"session_id": session}),
                    "discard": ("POST", f"{url}/sess/{session}/discard", {}),
                    "read a session": ("GET", f"{url}/v1/sessions/{session}", None),
                    "control": ("POST", f"{url}/admin/control", {"command": "pause"}),
                    "pause state": ("GET", f"{url}/v1/rollout/pause_state", None),
                    "engines": ("GET", f"{url}/v1/rollout/engines", None),
                    "a driver route, another method": ("GET", f"{url}/v1/sessions", None),
                }
                on_driver = {
                    "chat": ("POST", f"{driver_url}/sess/{session}/v1/chat/completions", chat),
                    "chat by header": ("POST", f"{driver_url}/v1/chat/completions", chat),
                    "messages": ("POST", f"{driver_url}/sess/{session}/v1/messages", chat),
                    "models": ("GET", f"{driver_url}/v1/models", None),
                }
                answers: dict[str, tuple[int, str]] = {}
                for name, (method, target, body) in {**on_scaffold, **on_driver}.items():
                    answer = await http.request(method, target, json=body, headers=token)
                    answers[name] = (answer.status_code, answer.text)
                probes = [
                    (await http.get(f"{where}/{probe}")).status_code
                    for where in (url, driver_url)
                    for probe in ("health", "metrics")
                ]
                state = await http.get(f"{driver_url}/v1/rollout/pause_state")
                assert state.status_code == 200, state.text
            await driver.finalize(session, reward=0.5)
            [segment] = await driver.segments(session, timeout_s=120)
    finally:
        ingress.stop()
        worker.stop()
    for name, (status, text) in answers.items():
        assert status == 404 and '"error"' in text, f"{name}: {status} {text}"
    assert '"type":"not_found_error"' in answers["messages"][1].replace(" ", "")
    assert probes == [200, 200, 200, 200]
    assert segment.reward == 0.5
    events = await read_all(settings, settings.topic("steps"), steps_topic_adapter)
    kinds = [type(e) for e in events if e.session_id == session]
    assert kinds == [SessionOpened, StepRecorded, SessionFinalized]
