"""ZERO-LATENCY ENGINE DOUBLE for benchmarks — never a measurement of an engine.

A real HTTP/1.1 server (keep-alive, TCP_NODELAY) that answers at once with precomputed bytes, so
a benchmark measures only what sits between a client and the engine:

- ``POST /inference/v1/generate``: vLLM's token API (the ingress' client path), JSON or SSE, a
  fixed completion (a Qwen3 ``<tool_call>`` then the end-of-turn token) with per-token logprobs.
- ``POST /v1/chat/completions``: the OpenAI shape LiteLLM speaks to an engine, the same reply
  as a parsed tool call (ids count up so clients see distinct calls).
- ``GET /health``; ``GET /is_paused``, always false: an ingress driving its engines' pause
  state (the default) settles on it instead of retrying an unknown route every second.

    .venv/bin/python -m bench.engine_double --port 8000 [--model-path .models/tiny-qwen3]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import socket
from pathlib import Path

from titoflow.settings import Settings
from titoflow.tito.tokenizer import load_tokenizer

TOOL = "read_file"
ARGUMENTS = {"path": "src/titoflow/app.py"}
REPLY = f"<tool_call>\n{json.dumps({'name': TOOL, 'arguments': ARGUMENTS})}\n</tool_call>"


def generate_bodies(token_ids: list[int]) -> tuple[bytes, bytes]:
    """The vLLM token-API answer for ``token_ids``: as one JSON body and as an SSE stream."""
    choice = {
        "index": 0,
        "finish_reason": "stop",
        "stop_reason": None,
        "token_ids": token_ids,
        "weight_versions": [{"version": "double", "start": 0, "end": len(token_ids)}],
        "logprobs": {
            "content": [
                {
                    "token_id": t,
                    "logprob": -0.25,
                    "top_logprobs": [{"token_id": t, "logprob": -0.25}],
                }
                for t in token_ids
            ]
        },
    }
    body = json.dumps({"model": "double", "choices": [choice]}).encode()
    stream = b"data: " + body + b"\n\ndata: [DONE]\n\n"
    return body, stream


def chat_body(call_id: int) -> bytes:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_double_{call_id}",
                "type": "function",
                "function": {"name": TOOL, "arguments": json.dumps(ARGUMENTS)},
            }
        ],
    }
    return json.dumps(
        {
            "id": f"chatcmpl-double-{call_id}",
            "object": "chat.completion",
            "created": 1_790_000_000,
            "model": "double",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    ).encode()


def _response(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Double:
    def __init__(self, completion_ids: list[int]) -> None:
        generate, stream = generate_bodies(completion_ids)
        self.generate = _response("200 OK", generate)
        self.generate_stream = _response("200 OK", stream, "text/event-stream")
        self.health = _response("200 OK", b"{}")
        self.unpaused = _response("200 OK", b'{"is_paused": false}')
        self.missing = _response("404 Not Found", b'{"error": "not found"}')
        self.calls = itertools.count()

    def answer(self, method: str, path: str, body: bytes) -> bytes:
        if path.startswith("/inference/v1/generate"):
            streamed = b'"stream": true' in body or b'"stream":true' in body
            return self.generate_stream if streamed else self.generate
        if path.startswith("/v1/chat/completions"):
            return _response("200 OK", chat_body(next(self.calls)))
        if method == "GET" and path.startswith(("/health", "/v1/models")):
            return self.health
        if method == "GET" and path.startswith("/is_paused"):
            return self.unpaused
        return self.missing

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                writer.write(self.answer(method, path, body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def serve(port: int, model_path: Path) -> None:
    tokenizer = load_tokenizer(model_path)
    ids = tokenizer.encode(REPLY, add_special_tokens=False)
    ids.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    double = Double(ids)
    server = await asyncio.start_server(double.serve, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-path", type=Path, default=Settings().model_path)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.model_path))


if __name__ == "__main__":
    main()
