"""A short agent loop through a running stack, with the official ``openai`` SDK: a task that
names a tool, the policy's tool call, the tool's result fed back, the policy's answer; then the
driver's finalize and the session's segment read back from the segments topic and shown as
``titoflow inspect`` shows it."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass

import httpx
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from schemas.events import SegmentFinalized
from titoflow.client.consumer import SegmentConsumer
from titoflow.settings import Settings
from titoflow.tito.tokenizer import load_tokenizer
from workers.inspect.ansi import render_text
from workers.inspect.decode import TokenDecoder
from workers.inspect.view import Loaded, build_view

COMMAND = "echo hello from titoflow"
TASK = f"Use the bash tool to run: {COMMAND}"
TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


@dataclass
class Loop:
    """What the agent loop saw: the tool call's name and arguments, the result it fed back,
    and the policy's final answer."""

    tool: str
    arguments: str
    result: str
    answer: str


def run_tool(name: str, arguments: str) -> str:
    """The demo's one tool, played safely: it answers only the command the task asked for
    (what ``echo`` prints), and says so for anything else."""
    try:
        command = json.loads(arguments).get("command")
    except (json.JSONDecodeError, AttributeError):
        command = None
    if name != "bash" or command != COMMAND:
        return f"refused: the demo runs only {COMMAND!r}"
    return COMMAND.removeprefix("echo ") + "\n"


async def agent_loop(
    ingress_url: str,
    session_id: str,
    max_tokens: int = 128,
    driver_token: str = "",
    driver_url: str = "",
) -> Loop:
    """Runs the task to the policy's final answer, then finalizes the session (as its driver,
    with ``driver_token``)."""
    client = AsyncOpenAI(base_url=f"{ingress_url}/sess/{session_id}/v1", api_key="local")
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": TASK}]
    first = await client.chat.completions.create(
        model="titoflow-policy", messages=messages, tools=TOOLS, max_tokens=max_tokens
    )
    reply = first.choices[0].message
    calls = [c for c in reply.tool_calls or [] if c.type == "function"]
    if not calls:
        await client.close()
        raise RuntimeError(f"the policy answered without a tool call: {reply.content!r}")
    call = calls[0]
    result = run_tool(call.function.name, call.function.arguments)
    messages += [
        {
            "role": "assistant",
            "content": reply.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": call.function.arguments,
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]
    second = await client.chat.completions.create(
        model="titoflow-policy", messages=messages, tools=TOOLS, max_tokens=max_tokens
    )
    await client.close()
    driver = {"authorization": f"Bearer {driver_token}"} if driver_token else None
    async with httpx.AsyncClient(headers=driver) as http:
        finalize = f"{driver_url or ingress_url}/sess/{session_id}/finalize"
        (await http.post(finalize, json={})).raise_for_status()
    answer = second.choices[0].message.content or ""
    return Loop(call.function.name, call.function.arguments, result, answer)


async def wait_for_segment(
    settings: Settings, session_id: str, timeout_s: float = 60.0
) -> tuple[SegmentFinalized, tuple[str, int, int]]:
    """Reads the segments topic (no group, no commits) until a segment of this session arrives;
    returns it with its (topic, partition, offset)."""
    async with SegmentConsumer(settings) as consumer, asyncio.timeout(timeout_s):
        async for segment in consumer:
            if segment.session_id == session_id:
                return segment, consumer.position
    raise AssertionError("the segment consumer stopped")


async def run_demo(settings: Settings, ingress_url: str, color: bool = True) -> SegmentFinalized:
    session_id = f"demo-{uuid.uuid4().hex[:8]}"
    base_url = f"{ingress_url}/sess/{session_id}/v1"
    print(f"\ndemo: an agent loop in session {session_id} through {base_url}")
    print(f"  user:        {TASK}")
    loop = await agent_loop(
        ingress_url,
        session_id,
        driver_token=settings.driver_token,
        driver_url=settings.driver_url(ingress_url),
    )
    print(f"  tool call:   {loop.tool}({loop.arguments})")
    print(f"  tool result: {loop.result.strip()!r}")
    print(f"  answer:      {loop.answer!r}")
    segment, (topic, partition, offset) = await wait_for_segment(settings, session_id)
    print(
        f"segment {segment.segment_id} went to topic {topic}, partition {partition}, offset "
        f"{offset}: {len(segment.token_ids)} tokens ({sum(segment.loss_mask)} generated) "
        f"in {len(segment.steps)} steps (titoflow inspect --session {session_id}):\n"
    )
    decoder = TokenDecoder(load_tokenizer(settings.model_path, settings.trust_remote_code))
    view = build_view(Loaded(segment, json.loads(segment.model_dump_json())), decoder)
    print(render_text([view], color=color))
    return segment
