"""The ingress' log follower on the real broker (tansu): one consumer for the control and ended
logs. At start it has applied what both logs held (so a replica starts paused, knowing which
sessions opened and ended), then it hands on what is published to either, each log in order,
each event to its own log's subscribers only, while its consumer waits in the fetch rather than
FastStream's poll (``titoflow.bus.LogReader``)."""

from __future__ import annotations

import asyncio

from ingress.control.log_follower import LogFollower, control_log, ended_log
from schemas.control import Pause, Resume
from schemas.events import SessionBudget, SessionBudgeted, SessionEnded
from titoflow.bus import Publisher
from titoflow.settings import Settings


def budgeted(session: str) -> bytes:
    event = SessionBudgeted(session_id=session, event_time=1.0, budget=SessionBudget())
    return event.model_dump_json().encode()


async def test_one_follower_applies_both_logs_at_start_then_follows_both_in_order(
    settings: Settings,
) -> None:
    control_topic, ended_topic = settings.topic("control"), settings.topic("ended")
    publisher = Publisher(settings)
    await publisher.start()
    await publisher.publish(control_topic, "c", Pause(event_time=1.0).model_dump_json().encode())
    for session in ("a", "b"):
        await publisher.publish(ended_topic, session, budgeted(session))
    follower = LogFollower(settings)
    control, ended = control_log(follower), ended_log(follower)
    heard: list[tuple[str, str, int]] = []
    control.subscribe(lambda event, offset: heard.append(("control", event.type, offset)))
    ended.subscribe(lambda event, offset: heard.append((event.session_id, event.type, offset)))
    try:
        assert await follower.start(settings.publish_timeout_s)
        assert sorted(h[:2] for h in heard) == [
            ("a", "session_budgeted"),
            ("b", "session_budgeted"),
            ("control", "pause"),
        ]
        running = asyncio.create_task(follower.run())
        ends = SessionEnded(session_id="a", event_time=2.0, how="idle")
        await publisher.publish(ended_topic, "a", ends.model_dump_json().encode())
        await publisher.publish(
            control_topic, "c", Resume(event_time=2.0).model_dump_json().encode()
        )
        async with asyncio.timeout(30):
            while len(heard) < 5:
                await asyncio.sleep(0.01)
        running.cancel()
    finally:
        await follower.stop()
        await publisher.stop()
    assert [h for h in heard if h[0] == "control"] == [
        ("control", "pause", 0),
        ("control", "resume", 1),
    ]
    assert [h[:2] for h in heard if h[0] == "a"] == [
        ("a", "session_budgeted"),
        ("a", "session_ended"),
    ]
