"""Request bodies as JSON values within bounds: bytes in, a value or a 400.

Invariant: whatever the bytes — any depth, any size within the body limit, invalid UTF-8,
lone surrogates, NaN, numbers beyond a double — parsing answers a value or raises
:class:`~titoflow.errors.InvalidRequest`; it never recurses past a fixed bound. A value it
answers nests at most ``max_depth`` arrays and objects deep and holds only what JSON carries
back unchanged (no NaN, no infinity, no lone surrogate), so the caches keyed by its orjson
bytes, the chat template and the event encoders downstream (which recurse, and stop at 255
levels) take it whole.
"""

from __future__ import annotations

import json
import math
import re
import threading
from typing import Any

import orjson

from titoflow.errors import InvalidRequest


def parse_json(raw: bytes | bytearray, max_depth: int) -> Any:
    """A body's JSON value, nested at most ``max_depth`` arrays and objects deep, else a 400."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = _loads_slowly(raw, max_depth)
    if nesting_exceeds(value, max_depth):
        raise InvalidRequest(_too_deep(max_depth))
    return value


def _loads_slowly(raw: bytes | bytearray, max_depth: int) -> Any:
    """What orjson refused, read by the standard library, which has the final word: lone
    surrogates, which clients do send (mended), and bodies orjson finds too deep (beyond 1,024
    levels) or invalid, which it explains. Its recursion is bounded by Python's, so a body too
    deep for it is refused too, never a crash."""
    try:
        value = json.loads(raw, parse_constant=_not_json, parse_float=_finite)
    except RecursionError as exc:
        raise InvalidRequest(_too_deep(max_depth)) from exc
    except ValueError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from exc
    return _mend_surrogates(value)


# The deepest nesting orjson.dumps writes (it refuses more: "Recursion limit reached").
_ORJSON_DEPTH = 254


class _Wrappers(threading.local):
    """Per thread and depth limit, ``_ORJSON_DEPTH - limit`` nested one-element arrays, the
    innermost a slot for the value probed: built once, as building them cost more than
    writing a small body."""

    def __init__(self) -> None:
        self.by_limit: dict[int, tuple[list[Any], list[Any]]] = {}

    def around(self, limit: int) -> tuple[list[Any], list[Any]]:
        """The outermost array and the slot."""
        if limit not in self.by_limit:
            slot: list[Any] = [None]
            outer = slot
            for _ in range(_ORJSON_DEPTH - limit - 1):
                outer = [outer]
            self.by_limit[limit] = outer, slot
        return self.by_limit[limit]


_WRAPPERS = _Wrappers()


def nesting_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``limit`` deep (``limit`` below
    :data:`_ORJSON_DEPTH`). orjson checks it in C: ``value`` inside as many arrays as orjson
    writes beyond ``limit`` levels is written, or refused as too deep — a fifth of a walk's
    cost on Claude Code's requests. What orjson refuses for another reason (an integer beyond
    64 bits, from the standard library's parse) is walked instead."""
    outer, slot = _WRAPPERS.around(limit)
    slot[0] = value
    try:
        orjson.dumps(outer)
    except orjson.JSONEncodeError:
        return _walk_exceeds(value, limit)
    finally:
        slot[0] = None  # holds no body past its check
    return False


def _walk_exceeds(value: Any, limit: int) -> bool:
    """:func:`nesting_exceeds` walked with a stack of its own, so no depth makes it recurse."""
    if type(value) is not dict and type(value) is not list:
        return False
    stack = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        if depth > limit:
            return True
        for child in node.values() if type(node) is dict else node:
            kind = type(child)  # exact types: what a JSON parser makes, checked fastest
            if kind is dict or kind is list:
                push((child, depth + 1))
    return False


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins the escapes of a pair


def _mend_surrogates(value: Any) -> Any:
    """``value`` with each lone surrogate (what a client sends that cut a UTF-16 string
    between the halves of a pair) replaced by U+FFFD, as a UTF-8 decoder replaces any invalid
    sequence: no tokenizer takes them as text. Deterministic, so a re-sent history reads the
    same. Walked with a stack of its own, like :func:`_walk_exceeds`."""
    root = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        container, key = stack.pop()
        node = container[key]
        if isinstance(node, str):
            container[key] = _LONE_SURROGATE.sub("\ufffd", node)
        elif isinstance(node, list):
            stack.extend((node, index) for index in range(len(node)))
        elif isinstance(node, dict):
            mended = {_LONE_SURROGATE.sub("\ufffd", name): child for name, child in node.items()}
            container[key] = mended
            stack.extend((mended, name) for name in mended)
    return root[0]


def _too_deep(limit: int) -> str:
    return (
        f"the body nests arrays and objects more than {limit} levels deep "
        "(the limit: TITOFLOW_MAX_JSON_DEPTH)"
    )


def _not_json(constant: str) -> Any:
    """NaN and ±Infinity are not JSON. Refused, so every body holds only values that orjson
    writes back as they came: caches key parsed messages and tools by those bytes."""
    raise ValueError(f"{constant} is not a JSON value")


def _finite(literal: str) -> float:
    """A number literal beyond a double (``1e999``) would be read as ±inf, which JSON cannot
    carry back: refused like NaN."""
    number = float(literal)
    if math.isinf(number):
        raise ValueError(f"{literal} is beyond the range of a double")
    return number
