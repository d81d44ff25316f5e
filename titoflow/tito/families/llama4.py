"""Llama 4 (Scout, Maverick) with pythonic tool calls: header-delimited turns ended by
``<|eot|>``, and calls written as the assistant message's whole content, a Python list of
keyword calls::

    <|header_start|>assistant<|header_end|>

    [get_weather(city="Paris", days=3), list_dir()]<|eot|>

The model may wrap the list in ``<|python_start|>…<|python_end|>``. Tool results come back in
the ``ipython`` role, as JSON strings. There is no reasoning block.

The parser reads a call list as vLLM's ``llama4_pythonic`` parser does: the whole output is the
list, each call a bare name with keyword arguments whose values are literals (strings, numbers,
lists, tuples and sets as lists, dicts, ``True``/``None`` or JSON's ``true``/``null``, an
f-string without placeholders, a signed number). Invariants, as Llama 3's (whose parser this
one refines): the result depends only on the whole text, never on its chunking; an output that
starts as a call list (``[name(``) but does not parse, positional arguments or an expression
as a value included, goes back exactly as generated with ``parse_error``; a call list inside
text stays text, with ``parse_error`` (the template writes calls as the whole message); other
text starting with ``[`` is content.

History: the template writes every argument as ``k="%s"``, the value formatted by Jinja (a
number ``"3"``, a dict in Python's repr), so a re-rendered call is not what the model sampled
(``call_arguments_rewritten``); the chain keeps the sampled tokens. It lists no tools unless
given ``custom_tools`` (it reads ``tool_definition`` only then), which vLLM does not pass.
"""

from __future__ import annotations

import ast
import keyword
import math
import re
from collections.abc import Sequence
from typing import Any

from titoflow.tito.families import grammar as g
from titoflow.tito.families.base import Family, Function, Grammar, ParserOptions, TokenLookup
from titoflow.tito.families.llama3 import Llama3Parser, NotACall
from titoflow.tito.output import OutputParser

PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"
# The special tokens of Meta's Llama 4 tokenizer (its named ones and reserved slots).
_SPECIAL = re.compile(
    r"<\|(?:begin_of_text|end_of_text|fim_(?:prefix|middle|suffix)|header_start|header_end|"
    r"eom|eot|step|python_start|python_end|finetune_right_pad|image_start|image_end|image|"
    r"patch|tile_[xy]_separator|reasoning_thinking_(?:start|end)|"
    r"(?:text_post_train_|vision_|reasoning_)?reserved_special_token_\d+)\|>"
)
# A list whose first item is a call: what the template writes and a call attempt starts with.
_CALL_LIST = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
# JSON's literals, which models write as often as Python's (vLLM reads them too).
_JSON_NAMES = {"true": True, "false": False, "null": None}


def _literal(node: ast.expr, key: str) -> Any:
    """A keyword argument's value, as vLLM's ``get_parameter_value`` reads it."""
    if isinstance(node, ast.Constant) and (
        node.value is None or isinstance(node.value, str | int | float)
    ):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise NotACall(f"argument {key!r} is not a finite number", attempt=True)  # 1e999
        return node.value
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
        return {
            k.value: _literal(v, key)  # type: ignore[union-attr]
            for k, v in zip(node.keys, node.values, strict=True)
        }
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [_literal(item, key) for item in node.elts]
    if isinstance(node, ast.JoinedStr) and all(isinstance(p, ast.Constant) for p in node.values):
        return "".join(str(p.value) for p in node.values)  # type: ignore[attr-defined]
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _literal(node.operand, key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    raise NotACall(f"argument {key!r} is not a literal", attempt=True)


def parse_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The calls of a whole message, a Python list of keyword calls, optionally in
    ``<|python_start|>``…``<|python_end|>``. Raises :class:`NotACall`."""
    body = text.strip()
    if body.startswith(PYTHON_START):
        body = body[len(PYTHON_START) :].replace(PYTHON_END, "").strip()
    attempt = _CALL_LIST.match(body) is not None
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError as exc:
        raise NotACall(f"invalid Python: {exc.msg}", attempt) from None
    if not isinstance(tree, ast.List) or not tree.elts:
        raise NotACall("not a list of calls", attempt)
    calls: list[tuple[str, dict[str, Any]]] = []
    for number, node in enumerate(tree.elts):
        if not isinstance(node, ast.Call):
            raise NotACall(f"item {number} is not a call", attempt)
        if not isinstance(node.func, ast.Name):
            raise NotACall(f"call {number}: the function is not a plain name", attempt=True)
        if node.args:
            raise NotACall(f"call {number}: positional arguments", attempt=True)
        arguments: dict[str, Any] = {}
        for argument in node.keywords:
            if argument.arg is None:
                raise NotACall(f"call {number}: ** arguments", attempt=True)
            arguments[argument.arg] = _literal(argument.value, argument.arg)
        calls.append((node.func.id, arguments))
    return calls


class Llama4Parser(Llama3Parser):
    """Content, or the whole output as a pythonic call list."""

    OPENERS: tuple[str, ...] = ("[", PYTHON_START)
    SPECIAL = _SPECIAL
    CALL_IN_TEXT = _CALL_LIST
    CALL_IN_TEXT_ERROR = "tool call: a call list inside text"

    def _parse_calls(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        return parse_calls(text)


def _parser(options: ParserOptions) -> OutputParser:
    return Llama4Parser(options)


def _call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``name(k=VALUE, …)`` with the tool's required arguments, in the order ``required``
    lists them, each value JSON (a Python literal but for JSON's ``true``/``false``/``null``,
    which the parser and vLLM's read): xgrammar has no pythonic style, so optional arguments
    are left out of a forced call."""
    bodies = []
    for name, parameters in functions:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"tool name {name!r} cannot be written as a Python call")
        schema = parameters if isinstance(parameters, dict) else {}
        properties = schema.get("properties", {})
        elements = [g.text(f"{name}(")]
        for number, key in enumerate(schema.get("required", [])):
            if not key.isidentifier() or keyword.iskeyword(key):
                raise ValueError(f"argument {key!r} of {name!r} cannot be a Python keyword")
            elements.append(g.text((", " if number else "") + f"{key}="))
            elements.append(g.arguments(properties.get(key, True)))
        elements.append(g.text(")"))
        bodies.append(g.sequence(elements))
    return g.one_of(bodies)


def _is_llama4_pythonic(template: str) -> bool:
    # Meta's own Llama 4 template writes JSON calls: not this family (see docs/models.md).
    return "<|header_start|>" in template and "<|eot|>" in template and "[func_name1(" in template


LLAMA4 = Family(
    name="llama4",
    summary="Llama 4 Scout/Maverick, pythonic: [name(k=v, ...)] as the whole assistant message",
    detect=_is_llama4_pythonic,
    parser=_parser,
    grammar=Grammar(
        call=_call,
        separator=", ",
        prefix=lambda token_id: [g.text("[")],
        suffix=lambda token_id: [g.text("]")],
    ),
    # <|eom|> ends a message a tool result continues; <|end_of_text|> is the vocabulary's EOS.
    # Meta's generation stops on both, besides <|eot|>.
    stop_tokens=("<|eom|>", "<|end_of_text|>"),
    decode_special_tokens=True,
    # The format has no text beside calls: the template's system prompt forbids it, and vLLM's
    # parser reads such an output as text (titoflow: text with parse_error).
    content_with_calls=False,
    history=(
        'writes each argument as k="%s" (numbers quoted, dicts and lists in Python\'s repr, '
        "True/None capitalized), so a re-rendered call is not the sampled one; drops a "
        "<|python_start|> the model opened the call with; tool results written as JSON strings"
    ),
    divergences=("call_arguments_rewritten", "python_tag_dropped"),
    tools_stand_in=True,
)
