"""LEAN TURN for benchmarks: the least a Python ingress doing titoflow's per-turn work costs.

Between the floor proxy (bench/floor_proxy.py: the HTTP hop and an acknowledged publish, no
work) and titoflow's ingress: on the same stack (uvicorn on uvloop and httptools, bare ASGI),
with titoflow's own components, ``POST /sess/<id>/v1/chat/completions`` does only what a
token-in/token-out turn cannot skip, and nothing titoflow adds around it:

- the body decoded (orjson) and the re-sent history compared with the one the session's tokens
  cover (the wire dicts, compared whole);
- the new messages made :class:`~titoflow.tito.messages.Message` objects and rendered as the
  continuation of the session's tokens (:meth:`~titoflow.tito.render.ChatRenderer.continuation`:
  the policy's template and tokenizer, as the ingress renders), or the whole conversation on a
  history it does not hold;
- the engine's token API called with the whole prompt (titoflow's engine client), the answer
  decoded and parsed by the family's parser;
- a step of the tail and the completion's ids and logprobs published (titoflow's
  :class:`~titoflow.bus.Publisher`) and acknowledged before the answer.

Nothing else: no validation of what it is sent (a malformed body is a 500), no admission, no
budgets, no sampling record, no metrics, no control log, no trace; one process, sessions never
evicted. So its added cost is the floor's plus the TITO work itself, and titoflow's above it is
what titoflow's ingress does besides (bench/overhead.py prints the three apart).

    .venv/bin/python -m bench.lean_turn --port 8002 --engine-url URL --bootstrap HOST:PORT \
        --topic NAME
"""

from __future__ import annotations

import uuid
from array import array
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.floor_proxy import answer, lifespan, read_body, serve, stack_arguments
from titoflow.bus import Publisher, create_topics
from titoflow.engine.api import GenerateParams
from titoflow.engine.vllm import VLLMEngine
from titoflow.settings import Settings
from titoflow.tito.families.base import ParserOptions
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.output import ParsedOutput
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer

Scope = dict[str, Any]
MAX_TOKENS = 32


@dataclass
class LeanSession:
    raw: list[Any] = field(default_factory=list)  # the wire messages its tokens cover
    messages: list[Message] = field(default_factory=list)
    # Prompt and completions, extended in place; int32, which the engine client writes from
    # memory (titoflow's chains hold theirs so too).
    tokens: array[int] = field(default_factory=lambda: array("i"))


def message_of(raw: dict[str, Any]) -> Message:
    """An OpenAI chat message (text content, tool calls, a tool result) as the renderer's."""
    calls = tuple(
        ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
        for c in raw.get("tool_calls") or ()
    )
    return Message(
        role=raw["role"],
        content=raw.get("content") or "",
        tool_calls=calls,
        tool_call_id=raw.get("tool_call_id"),
    )


class LeanTurns:
    """The TITO part of a turn: each session's prompt, extended by the continuation of what it
    holds, or rendered whole."""

    def __init__(self, renderer: ChatRenderer) -> None:
        self.renderer = renderer
        self.sessions: dict[str, LeanSession] = {}

    def prompt(
        self, session_id: str, raw: list[Any], tools: list[Any]
    ) -> tuple[LeanSession, list[int]]:
        """The session, its ``tokens`` now the prompt for ``raw``; the tokens added to it."""
        session = self.sessions.setdefault(session_id, LeanSession())
        held = len(session.raw)
        if held and raw[:held] == session.raw and held < len(raw):
            session.messages += [message_of(m) for m in raw[held:]]
            last = session.tokens[-1]
            ended = last if last in self.renderer.end_ids else None
            tail = self.renderer.continuation(session.messages, held, ended, tools, {})
        else:
            session.messages = [message_of(m) for m in raw]
            tail = self.renderer.full_prompt(session.messages, tools, {})
            session.tokens = array("i")
        session.raw = raw
        session.tokens.extend(tail)
        return session, tail

    @staticmethod
    def answered(
        session: LeanSession, parsed: ParsedOutput, completion: list[int]
    ) -> dict[str, Any]:
        """The session extended by its answer; the answer as the client echoes it."""
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in parsed.tool_calls
        ]
        echo: dict[str, Any] = {"role": "assistant", "content": parsed.content or ""}
        if calls:
            echo["tool_calls"] = calls
        session.raw.append(echo)
        session.messages.append(message_of(echo))
        session.tokens.extend(completion)
        return echo


class LeanTurn:
    def __init__(self, engine_url: str, settings: Settings, topic: str) -> None:
        self.settings = settings
        self.publisher = Publisher(settings)
        self.topic = topic
        self.tokenizer = load_tokenizer(settings.model_path)
        self.renderer = ChatRenderer.for_setting(self.tokenizer, settings.model_family)
        self.turns = LeanTurns(self.renderer)
        self.engine = VLLMEngine(engine_url, 600)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send, self._start, self._stop)
            return
        body = await read_body(receive)
        path: str = scope["path"]
        if not path.startswith("/sess/"):
            await answer(send, 200, b'{"status":"ok"}')
            return
        session_id = path[6 : path.index("/", 6)]
        request = orjson.loads(body)
        tools = request.get("tools") or []
        session, tail = self.turns.prompt(session_id, request["messages"], tools)
        params = GenerateParams(
            max_tokens=request.get("max_tokens") or MAX_TOKENS,
            seed=request.get("seed"),
            stop_token_ids=self.renderer.stop_token_ids,
        )
        step_id = uuid.uuid4().hex
        generation = await self.engine.generate(session.tokens, params, step_id)
        ids = generation.token_ids
        text_ids = ids[:-1] if ids and ids[-1] in self.renderer.end_ids else ids
        parser = self.renderer.family.parser(ParserOptions(step_id=step_id, tools=tools))
        parser.feed(self.tokenizer.decode(text_ids, skip_special_tokens=True))
        _, parsed = parser.finish()
        step = {
            "session_id": session_id,
            "step_id": step_id,
            "prefix_len": len(session.tokens) - len(tail),
            "prompt_tail": tail,
            "completion_ids": ids,
            "logprobs": generation.logprobs,
            "finish_reason": generation.finish_reason,
        }
        await self.publisher.publish(self.topic, session_id, orjson.dumps(step))
        prompt_len = len(session.tokens)
        echo = LeanTurns.answered(session, parsed, ids)
        choice = {
            "index": 0,
            "message": {**echo, "content": echo["content"] or None},
            "finish_reason": "tool_calls" if "tool_calls" in echo else "stop",
        }
        reply = {
            "id": step_id,
            "object": "chat.completion",
            "model": request["model"],
            "choices": [choice],
            "usage": {"prompt_tokens": prompt_len, "completion_tokens": len(ids)},
        }
        await answer(send, 200, orjson.dumps(reply))

    async def _start(self) -> None:
        await create_topics(self.settings, {self.topic: 1})
        await self.publisher.start()

    async def _stop(self) -> None:
        await self.publisher.stop()
        await self.engine.close()


def main() -> None:
    parser = stack_arguments(__doc__.splitlines()[0])
    parser.add_argument("--topic", required=True)
    args = parser.parse_args()
    settings = Settings(bootstrap_servers=args.bootstrap)
    serve(LeanTurn(args.engine_url.rstrip("/"), settings, args.topic), args.port)


if __name__ == "__main__":
    main()
