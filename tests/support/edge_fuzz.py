"""What the HTTP edge fuzz sends (tests/ingress/wire/test_edge_fuzz.py, and
tests/ingress/wire/test_hot_routes.py on the same cases): every public endpoint of both
listeners of the whole ingress with the real request shape it is seeded from, and
hypothesis-built requests to it (:func:`cases`): bodies derived from the seeds and mutated
structurally (wrong types, missing and extra fields, huge, deep and unicode values, lone
surrogates, NaN, nulls), raw non-JSON bodies, bad headers, odd session ids, the wrong listener;
and the ingress they are sent to (:func:`fuzz_app`: the SCRIPTED ENGINE DOUBLE answering, its
events and control commands recorded).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from hypothesis import strategies as st

from ingress.turns.service import ServiceOptions
from ingress.wire.http import session_key
from tests.support.apps import scripted_ingress
from tests.support.doubles import RecordingBus, RecordingPublisher
from tests.support.families import qwen3
from titoflow.settings import Settings

SCAFFOLD_PORT, DRIVER_PORT = 8000, 8001
DRIVER_TOKEN, ADMIN_TOKEN = "fuzz-driver-token", "fuzz-admin-token"

CHAT: dict[str, Any] = {
    "model": "m",
    "session_id": "fz-chat-0",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"cmd": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": "Run a command.",
                "parameters": {
                    "type": "object",
                    "properties": {"cmd": {"type": "string"}},
                    "required": ["cmd"],
                },
            },
        }
    ],
    "tool_choice": "auto",
    "max_tokens": 8,
    "temperature": 0.5,
    "stop": ["Observation:"],
    "logprobs": True,
    "top_logprobs": 2,
    "stream": False,
    "stream_options": {"include_usage": True},
}
COUNT: dict[str, Any] = {
    "model": "m",
    "metadata": {"session_id": "fz-chat-1", "user_id": '{"device": "x"}'},
    "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "ls it", "signature": ""},
                {"type": "text", "text": "Listing."},
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}],
        },
    ],
    "tools": [
        {
            "name": "Bash",
            "description": "Run a command.",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
        {"type": "web_search_20250305", "name": "web_search"},
    ],
    "tool_choice": {"type": "auto"},
    "thinking": {"type": "adaptive"},
}
MESSAGES: dict[str, Any] = {
    **COUNT,
    "max_tokens": 8,
    "temperature": 0.5,
    "stop_sequences": ["Observation:"],
    "stream": False,
}
RESPONSES: dict[str, Any] = {
    "model": "m",
    "session_id": "fz-chat-2",
    "instructions": "You are terse.",
    "input": [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "ls it"}]},
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
    ],
    "tools": [
        {
            "type": "function",
            "name": "exec_command",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            "strict": False,
        },
        {"type": "web_search"},
    ],
    "tool_choice": "auto",
    "max_output_tokens": 8,
    "store": False,
    "stream": False,
}
GENERATE: dict[str, Any] = {
    "session_id": "fz-chat-3",
    "input_ids": [1, 2, 3],
    "sampling_params": {"max_tokens": 4, "temperature": 0.5, "logprobs": 1, "stop_token_ids": [5]},
    "model": "m",
}
OPEN: dict[str, Any] = {
    "session_id": "fz-open-0",
    "instance_id": "task-1",
    "channel": "train",
    "metadata": {"data_source": "gsm8k"},
    "options": {"build_mode": "last-step"},
}
FINALIZE: dict[str, Any] = {"session_id": "fz-end-0", "reward": 1.0, "metadata": {"k": "v"}}
DISCARD: dict[str, Any] = {"session_id": "fz-end-0", "metadata": {"why": "timeout"}}
CONTROL: dict[str, Any] = {"type": "engine_added", "url": "http://127.0.0.1:9", "weight": 0.5}


@dataclass(frozen=True)
class Endpoint:
    """One route: ``{s}`` in its path is a session id drawn per case."""

    method: str
    path: str
    plane: str  # "scaffold", "driver" or "both"
    seed: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        return f"{self.method} {self.path}"


ENDPOINTS = [
    *(
        Endpoint("POST", path, "scaffold", seed)
        for seed, paths in (
            (CHAT, ("/v1/chat/completions", "/sess/{s}/v1/chat/completions")),
            (MESSAGES, ("/v1/messages", "/sess/{s}/v1/messages")),
            (COUNT, ("/v1/messages/count_tokens", "/sess/{s}/v1/messages/count_tokens")),
            (RESPONSES, ("/v1/responses", "/sess/{s}/v1/responses")),
            (GENERATE, ("/generate", "/sess/{s}/generate")),
        )
        for path in paths
    ),
    Endpoint("GET", "/v1/models", "scaffold"),
    Endpoint("GET", "/sess/{s}/v1/models", "scaffold"),
    Endpoint("HEAD", "/sess/{s}", "scaffold"),
    Endpoint("GET", "/sess/{s}/v1", "scaffold"),
    Endpoint("POST", "/v1/sessions", "driver", OPEN),
    Endpoint("GET", "/v1/sessions/{s}", "driver"),
    Endpoint("POST", "/finalize", "driver", FINALIZE),
    Endpoint("POST", "/sess/{s}/finalize", "driver", FINALIZE),
    Endpoint("POST", "/discard", "driver", DISCARD),
    Endpoint("POST", "/sess/{s}/discard", "driver", DISCARD),
    Endpoint("POST", "/admin/control", "driver", CONTROL),
    Endpoint("GET", "/v1/rollout/pause_state", "driver"),
    Endpoint("GET", "/v1/rollout/engines", "driver"),
    Endpoint("GET", "/health", "both"),
    Endpoint("GET", "/metrics", "both"),
    Endpoint("GET", "/ready", "both"),
]

# --- what is sent ------------------------------------------------------------------------------

_DEEP = "\x00deep:{}\x00"  # a placeholder, written out as that many nested arrays
_DEEP_JSON = re.compile(rb'"\\u0000deep:(\d+)\\u0000"')

text = st.one_of(
    st.text(max_size=12),
    st.text(st.characters(categories=["Cs"]), min_size=1, max_size=2),  # lone surrogates
    st.integers(300, 6000).map(lambda n: "é" * n),
    st.sampled_from(["", " ", "\x00", "{{ x }}", "<|im_end|>", "</tool_call>", "a/b", "1", "-"]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    st.integers(2**64, 2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
)
weird = st.one_of(
    st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
        max_leaves=6,
    ),
    st.integers(20, 3000).map(_DEEP.format),
)


def _paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in items:
        yield from _paths(child, (*at, key))


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


@st.composite
def mutated(draw: st.DrawFn, seed: dict[str, Any]) -> Any:
    """``seed`` with one to three structural changes: a node replaced by a weird value, a
    field or element removed, a field added."""
    body: Any = copy.deepcopy(seed)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(body))))
        op = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
        if not path:
            body = draw(weird) if op == "replace" else body
            continue
        parent, key = _at(body, path[:-1]), path[-1]
        if op == "replace":
            parent[key] = draw(weird)
        elif op == "remove":
            del parent[key]
        elif isinstance(parent, dict):
            parent[draw(text)] = draw(weird)
        else:
            parent.insert(key, draw(weird))
    return body


def encoded(value: Any, utf8: bool) -> bytes:
    """JSON as a client might write it, NaN and lone surrogates included (``utf8``: raw, which
    leaves surrogates as invalid UTF-8; else ``\\u`` escapes), placeholders as deep arrays."""
    if utf8:
        raw = json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    else:
        raw = json.dumps(value).encode()
    return _DEEP_JSON.sub(lambda m: b"[" * int(m[1]) + b"]" * int(m[1]), raw)


RAW = [
    b"",
    b"null",
    b"NaN",
    b'{"model": NaN}',
    b'{"model": "m", "max_tokens": 1e999}',
    b"[]",
    b"\xef\xbb\xbf{}",
    "{}".encode("utf-16"),
    b"[" * 100_000,
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 3000 + b"1" + b"}" * 3000,
    b'["\\ud800",' + b"[" * 5000 + b"]" * 5000 + b"]",
    b'{"model": "m"',
    b"\xff\xfe\xfd",
]


@st.composite
def bodies(draw: st.DrawFn, seed: dict[str, Any]) -> bytes:
    kind = draw(st.sampled_from(["mutated"] * 6 + ["seed", "raw", "bytes", "truncated"]))
    if kind == "mutated":
        return encoded(draw(mutated(seed)), draw(st.booleans()))
    if kind == "raw":
        return draw(st.sampled_from(RAW))
    if kind == "bytes":
        return draw(st.binary(max_size=40))
    whole = encoded(seed, utf8=False)
    return whole if kind == "seed" else whole[: draw(st.integers(0, len(whole) - 1))]


valid_ids = st.one_of(
    st.sampled_from(["fz-chat-4", "fz-chat-5"]),
    st.integers(1, 10**9).map("fz-end-{}".format),
)
odd_ids = st.one_of(
    # What a URL path can carry (httpx refuses control characters; it escapes the rest).
    st.text(st.characters(exclude_characters="/?#%", exclude_categories=["Cs", "Cc"]), max_size=12),
    st.integers(200, 5000).map(lambda n: "s" * n),
    st.sampled_from(["..", "a b", "a:b", "é", "-x", "x" * 129]),
)
session_ids = st.integers(0, 3).flatmap(lambda pick: odd_ids if pick == 0 else valid_ids)
header_values = st.one_of(
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=24),
    st.sampled_from(["²", "-1", "99999999999999999999", "0", "", "Bearer ", "fz-chat-6"]),
)
HEADERS = [
    "content-type",
    "content-length",
    "x-session-id",
    "x-smg-routing-key",
    "x-instance-id",
    "x-turn-id",
    "authorization",
    "x-api-key",
    "anthropic-version",
]
bad_headers = st.dictionaries(st.sampled_from(HEADERS), header_values, max_size=3)


@dataclass
class Case:
    method: str
    path: str
    port: int
    headers: dict[bytes, bytes]
    body: bytes | None

    def __repr__(self) -> str:  # bodies run to megabytes: a failure shows their ends
        body = (
            self.body
            if self.body is None or len(self.body) < 600
            else (self.body[:300] + b"..." + self.body[-300:])
        )
        path = self.path if len(self.path) < 200 else self.path[:200] + "..."
        return f"Case({self.method} :{self.port}{path} headers={self.headers} body={body!r})"


@st.composite
def cases(draw: st.DrawFn, endpoint: Endpoint, keyed: bool = False) -> Case:
    """A request to ``endpoint``; ``keyed``: carrying, as its API key, the key of the session
    its path or its seed names (``implicit_sessions`` off)."""
    session = draw(session_ids)
    path = endpoint.path.replace("{s}", session)
    own = DRIVER_PORT if endpoint.plane == "driver" else SCAFFOLD_PORT
    other = SCAFFOLD_PORT if own == DRIVER_PORT else DRIVER_PORT
    port = draw(st.sampled_from([own] * 9 + [other]))
    token = ADMIN_TOKEN if endpoint.path.startswith("/admin") else DRIVER_TOKEN
    headers = {"content-type": "application/json", "authorization": f"Bearer {token}"}
    if keyed and endpoint.seed is not None:
        named = endpoint.seed.get("session_id") or endpoint.seed["metadata"]["session_id"]
        headers["x-api-key"] = session_key(
            DRIVER_TOKEN, session if "{s}" in endpoint.path else named
        )
    headers.update(draw(bad_headers) if draw(st.booleans()) else {})
    method = endpoint.method
    if draw(st.integers(0, 19)) == 0:  # now and then a method the route does not take
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]))
    seed = endpoint.seed
    if seed is not None and seed.get("session_id") == "fz-end-0":  # each ends its own session
        seed = {**seed, "session_id": f"fz-end-{draw(st.integers(1, 10**9))}"}
    body = draw(bodies(seed)) if seed is not None else None
    return Case(
        method, path, port, {k.encode(): v.encode("latin-1") for k, v in headers.items()}, body
    )


def fuzz_app(**overrides: Any) -> tuple[FastAPI, RecordingPublisher, RecordingBus]:
    """The ingress the fuzz runs (both listeners, every token, an engine and broker nobody
    reaches, a scripted engine answering), ``overrides`` on its settings."""
    config = Settings(
        ingress_port=SCAFFOLD_PORT,
        driver_port=DRIVER_PORT,
        driver_token=DRIVER_TOKEN,
        admin_token=ADMIN_TOKEN,
        engine_url="http://127.0.0.1:9",
        bootstrap_servers="127.0.0.1:9",
        **overrides,
    )
    options = ServiceOptions(max_model_len=4096, default_max_tokens=8, vocab_size=len(qwen3()))
    return scripted_ingress(config, ["Done.<|im_end|>"] * 100_000, options)
