"""Kimi K2.5/K2.6's tool declarations: :func:`titoflow.tito.families.kimi_tools.tools_ts_str`
against Moonshot's own ``tool_declaration_ts.py``, and the prompt the kimi family renders with
them.

The judge is Moonshot's file (``fixtures/kimi_k2/tool_declaration_ts.py``, verbatim from
thinking-machines-lab/tinker-cookbook ``tinker_cookbook/renderers/kimi_k2_5_tool_declaration_ts.py``
at commit f46503488a5f83bcd19b2eeb22a1cf431761be4e, "Copied from
kimi-k2.5-hf-tokenizer/tool_declaration_ts.py"; a later commit only reformats it, and the
tinker-cookbook 0.6.1 wheel ships that one), called as Kimi's ``apply_chat_template`` calls it:
on the tools deep-sorted by Kimi's ``deep_sort_dict`` (from ``fixtures/kimi_k2/
tokenization_kimi.py``), nothing passed where it raises. Cases: the corpus's tools, schemas
built to reach each branch of the file, and generated schemas.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.dev.tokenizers import kimi_k2 as recipe
from cli.dev.tokenizers import template_path, tokenizer_dir
from tests.support.corpus import corpus
from tests.support.families import family_tokenizer
from titoflow.tito.families.kimi_k2 import KIMI_K2
from titoflow.tito.families.kimi_tools import tools_ts_str
from titoflow.tito.messages import Message
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "kimi_k2"


def _load_declarations() -> Any:
    spec = importlib.util.spec_from_file_location(
        "kimi_tool_declaration_ts", FIXTURES / "tool_declaration_ts.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.encode_tools_to_typescript_style


def _load_deep_sort() -> Any:
    """``deep_sort_dict`` from Kimi's tokenizer code (the module itself imports what
    transformers 5 no longer has: only the function is taken)."""
    source = (FIXTURES / "tokenization_kimi.py").read_text()
    [node] = [
        n
        for n in ast.parse(source).body
        if isinstance(n, ast.FunctionDef) and n.name == "deep_sort_dict"
    ]
    namespace: dict[str, Any] = {"Any": Any}
    exec(
        compile(ast.Module(body=[node], type_ignores=[]), "tokenization_kimi.py", "exec"), namespace
    )
    return namespace["deep_sort_dict"]


ENCODE, DEEP_SORT = _load_declarations(), _load_deep_sort()


def theirs(tools: list[dict[str, Any]]) -> str | None:
    """What Kimi's ``apply_chat_template`` passes as ``tools_ts_str``."""
    tools = DEEP_SORT(tools)
    if not tools:
        return None
    try:
        return str(ENCODE(tools))
    except Exception:  # as Kimi's code: any failure, and the template writes the JSON
        return None


def fn(name: str, parameters: Any, description: str | None = "Does it.") -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "parameters": parameters}
    if description is not None:
        function["description"] = description
    return {"type": "function", "function": function}


OBJECT = {
    "type": "object",
    "description": "Where to look.",
    "properties": {
        "zeta": {"type": "string", "maxLength": 40, "minLength": 1, "pattern": "^[a-z]+$"},
        "alpha": {"type": "integer", "minimum": 0, "maximum": 9, "default": 3},
        "mid": {"type": "number", "description": "A ratio\n\nover two lines", "default": 0.5},
        "flag": {"type": "boolean", "default": False},
        "tags": {"type": "array", "items": {"type": "string", "description": "One tag."}},
        "plain": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
        "bare": {"type": "array"},
        "mode": {"type": "string", "enum": ["fast", "slow"], "default": "fast"},
        "maybe": {"type": ["string", "null"], "enum": ["x", None]},
        "level": {"enum": [1, 2.5, True, None]},
        "either": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "number"}}]},
        "many": {"type": ["string", "integer", "null", "object", "array", "boolean", "number"]},
        "nested": {
            "type": "object",
            "properties": {"deep": {"type": "object", "properties": {"x": {"type": "null"}}}},
            "required": ["deep"],
            "additionalProperties": False,
        },
        "open": {"type": "object", "additionalProperties": True},
        "typed_map": {"type": "object", "additionalProperties": {"type": "integer"}},
        "any_map": {"type": "object", "additionalProperties": {}},
        "anything": {},
        "always": True,
        "never": False,
        "listed": {"type": "array", "items": {"type": "object", "properties": {}}},
        "defaults": {"type": "object", "default": {"k": ["ü", 1]}},
        "ünïcode": {"type": "string", "description": "名前 🙂"},
    },
    "required": ["zeta", "nested", "alpha"],
}
DEFS = {
    "type": "object",
    "$defs": {
        "Node": {
            "type": "object",
            "description": "A tree node.",
            "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
        },
        "Color": {"enum": ["red", "green"]},
    },
    "properties": {
        "root": {"$ref": "#/$defs/Node", "description": "The root."},
        "c": {"$ref": "#/$defs/Color"},
    },
    "required": ["root"],
}
SELF = {
    "type": "object",
    "properties": {"next": {"$ref": "#"}, "value": {"type": "string"}, "a": {"type": "integer"}},
    "required": ["value"],
}
REFUSED = [
    {"type": "object", "properties": {"x": {"$ref": "#/$defs/Missing"}}},
    {"type": "object", "properties": {"x": {"$ref": "http://example.com/schema"}}},
    {"type": "object", "properties": {"x": {"type": "string", "enum": [1]}}},
    {"type": "object", "properties": {"x": {"type": ["integer", "string"], "enum": [1]}}},
    {"type": "object", "properties": {"x": {"type": ["date"]}}},
    {"type": "object", "properties": {"x": {"description": "no type"}}},
    {"type": "object", "properties": {"x": {"type": "object", "additionalProperties": 1}}},
]
CASES: dict[str, list[dict[str, Any]]] = {
    "corpus": [dict(tool) for tool in corpus()[1].tools],
    "object": [fn("inspect", OBJECT, "Looks.\nTwice.")],
    "defs": [fn("walk", DEFS)],
    "self": [fn("chain", SELF, None)],
    "empty": [
        fn("noop", {}),
        fn("none", None, ""),
        {"type": "function", "function": {"name": "bare"}},
    ],
    "mixed": [
        {"type": "_plugin", "name": "x"},
        fn("one", {"type": "object"}),
        {"type": "function"},
    ],
    "plugins": [{"type": "_plugin", "name": "x"}],
    **{f"refused-{i}": [fn("ok", OBJECT), fn("bad", schema)] for i, schema in enumerate(REFUSED)},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_declarations_are_kimis(name: str) -> None:
    tools = json.loads(json.dumps(CASES[name]))  # plain JSON, as a request body gives them
    expected = theirs(tools)
    assert tools_ts_str(tools) == expected
    if name.startswith("refused"):
        assert expected is None
    elif name != "plugins":
        assert expected and expected.startswith("# Tools\n\n## functions\nnamespace functions {")


_SCALARS = st.sampled_from(["string", "integer", "number", "boolean", "null"])
_NAMES = st.sampled_from(["a", "b", "path", "Zeta", "mode", "x_1", "ünï"])
_TEXT = st.sampled_from(["", "One line.", "Two\nlines", "Gap\n\nline", "// slashes"])


def _schemas() -> st.SearchStrategy[Any]:
    def extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        obj = st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(_NAMES, inner, max_size=4)},
            optional={
                "required": st.lists(_NAMES, max_size=3),
                "description": _TEXT,
                "additionalProperties": st.one_of(st.booleans(), inner),
            },
        )
        array = st.fixed_dictionaries(
            {"type": st.just("array")},
            optional={
                "items": inner,
                "minItems": st.integers(0, 3),
                "maxItems": st.integers(3, 9),
                "description": _TEXT,
            },
        )
        any_of = st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=3)})
        return st.one_of(obj, array, any_of)

    scalar = st.fixed_dictionaries(
        {"type": _SCALARS},
        optional={
            "description": _TEXT,
            "default": st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=4), st.booleans()),
            "maxLength": st.integers(0, 9),
            "minimum": st.floats(-1, 1, allow_nan=False),
        },
    )
    enum = st.fixed_dictionaries(
        {"enum": st.lists(st.one_of(st.text(max_size=3), st.integers(), st.none()), min_size=1)},
        optional={"type": st.sampled_from(["string", "integer", ["string", "null"]])},
    )
    union = st.fixed_dictionaries({"type": st.lists(_SCALARS, min_size=2, max_size=3, unique=True)})
    leaf: st.SearchStrategy[Any] = st.one_of(scalar, enum, union, st.just({}), st.booleans())
    return st.recursive(leaf, extend, max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(
    tools=st.lists(
        st.builds(fn, _NAMES, _schemas(), st.one_of(st.none(), _TEXT)), min_size=1, max_size=3
    )
)
def test_generated_declarations_are_kimis(tools: list[dict[str, Any]]) -> None:
    assert tools_ts_str(tools) == theirs(tools)


def k2_6_renderer(family: Any = KIMI_K2) -> ChatRenderer:
    tokenizer = load_tokenizer(tokenizer_dir("kimi_k2"))
    tokenizer.chat_template = template_path(recipe.K2_6_TEMPLATE).read_text()
    return ChatRenderer(tokenizer, family)


def test_the_k2_6_prompt_declares_the_tools_as_kimis_code_does() -> None:
    """With the declarations the template writes them, not the JSON (which it writes without:
    the family passes what Kimi's tokenizer code passes)."""
    tools = [dict(tool) for tool in corpus()[1].tools]
    user = [Message(role="user", content="hi")]
    prompt = k2_6_renderer().render_text(user, tools, {}, True)
    assert prompt.startswith(f"<|im_system|>tool_declare<|im_middle|>{theirs(tools)}<|im_end|>")
    without = k2_6_renderer(replace(KIMI_K2, template_variables=None))
    compact = json.dumps(tools, separators=(",", ":"), ensure_ascii=False)
    assert compact in without.render_text(user, tools, {}, True)


def test_the_k2_thinking_prompt_reads_no_declarations() -> None:
    renderer = ChatRenderer(family_tokenizer("kimi_k2"))
    conversation = corpus()[1]
    messages, tools = list(conversation.messages[:2]), conversation.tools
    plain = ChatRenderer(renderer.tokenizer, replace(KIMI_K2, template_variables=None))
    assert renderer.render_text(messages, tools, {}, True) == plain.render_text(
        messages, tools, {}, True
    )
