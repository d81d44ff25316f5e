"""GLM-4.5/4.6's cases (GLM-4.7's, GLM-5's and GLM-5.1's tags without the newlines among them)
for the parser parity test. vLLM serves these models with its ``glm45`` tool and reasoning
parsers (both its GLM-4.7 parser engine; ``glm47``, the tool parser name GLM-4.7 is served with
(ai-dynamo/dynamo#5512), is the same class), the reasoning parser first, its tool parser then
reading the content. The tokenizer is titoflow's labelled stand-in (GLM's special tokens at their
ids over Qwen3's ordinary vocabulary): the parsers read only the markers, which it holds as GLM's
does.

vLLM drops a call to a tool the request does not declare, so every tool its tests call is
declared here."""

from __future__ import annotations

import random
import re

from tests.support.parity import Call, Case, Difference, Family, mutants, mutator, swapping, tool

STRING = {"type": "string"}
GLM_TOOLS = [
    # The tools vLLM's GLM parser tests call, with the types their outputs write.
    tool("get_current_weather", {"city": STRING, "state": STRING, "unit": STRING}),
    tool("get_weather", {"city": STRING, "date": STRING}),
    tool("get_current_date", {}),
    tool("get_current_time", {}),
    tool("get_time", {}),
    tool(
        "send_message",
        {
            "recipient": STRING,
            "message": STRING,
            "priority": STRING,
            "greeting": STRING,
            "emoji": STRING,
        },
    ),
    tool(
        "calculate",
        {
            "operation": STRING,
            "a": {"type": "number"},
            "b": {"type": "number"},
            "enabled": {"type": "boolean"},
        },
    ),
    tool("apply_diff", {"s": STRING}),
    tool("read_file", {"path": STRING, "line": {"type": "integer"}, "options": {"type": "object"}}),
]


def glm_call(name: str, *pairs: tuple[str, str], sep: str = "\n") -> str:
    """A call as GLM-4.5 writes it (``sep`` "\\n"), or GLM-4.7 (``sep`` "")."""
    body = "".join(f"{sep}<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>" for k, v in pairs)
    return f"<tool_call>{name}{body}{sep}</tool_call>"


DALLAS = glm_call(
    "get_current_weather", ("city", "Dallas"), ("state", "TX"), ("unit", "fahrenheit"), sep="\n    "
)
BEIJING = glm_call("get_weather", ("city", "Beijing"), ("date", "2025-08-01"))

# vLLM tests/tool_parsers/test_glm4_moe_tool_parser.py, commit
# 024364d6695352f41c029121af6b8ecf2ae60184 (the whole-output extract_tool_calls tests), model
# outputs verbatim.
GLM4_VLLM = [
    Case("vllm_no_tools", "This is a test"),
    Case("vllm_single_tool_call", DALLAS),
    Case(
        "vllm_multiple_tool_calls",
        DALLAS + "\n    " + DALLAS.replace("Dallas", "Orlando").replace("TX", "FL"),
    ),
    Case(
        "vllm_tool_call_with_content_before",
        "I'll help you check the weather. "
        + DALLAS.replace("Dallas", "Seattle").replace("TX", "WA").replace("fahrenheit", "celsius"),
    ),
    Case(
        "vllm_tool_call_with_mixed_args",
        DALLAS.replace("Dallas", "New York").replace("TX", "NY").replace("fahrenheit", "celsius"),
    ),
    Case(
        "vllm_tool_call_with_chinese_content",
        "I will help you get the weather."
        + glm_call("get_weather", ("city", "Beijing"), ("date", "2025-08-01"), sep="\n    "),
    ),
    Case(
        "vllm_with_thinking_tags",
        "<think>I want to get the weather.</think>\n\nI will help you get the weather.\n" + BEIJING,
    ),
    Case(
        "vllm_malformed_xml",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Seattle</arg_value>\n"
        "<arg_key>incomplete_arg\n<arg_value>value</arg_value>\n</tool_call>",
    ),
    Case("vllm_empty_arguments", "<tool_call>get_current_time\n</tool_call>"),
    Case(
        "vllm_mixed_content",
        "I will help you get the weather info.\n\n" + BEIJING + "\n\nmeaningwhile, I will also "
        "check the weather in Shanghai.\n\n" + BEIJING.replace("Beijing", "Shanghai"),
    ),
    Case(
        "vllm_special_characters",
        glm_call(
            "send_message",
            ("recipient", "Amy"),
            ("message", "It is a nice day"),
            ("priority", "high"),
        ),
    ),
    Case("vllm_incomplete_tool_call", BEIJING.removesuffix("\n</tool_call>")),
    Case(
        "vllm_numeric_deserialization",
        glm_call(
            "calculate", ("operation", "add"), ("a", "42"), ("b", "3.14"), ("enabled", "true")
        ),
    ),
    Case("vllm_whitespace_preserved", glm_call("apply_diff", ("s", "    indented code    "))),
    Case("vllm_zero_argument_tool_call", "<tool_call>get_time\n</tool_call>"),
    Case("vllm_malformed_no_regex_match", "<tool_call>   "),
    Case(
        "vllm_unicode_characters_preserved",
        glm_call("send_message", ("greeting", "你好世界"), ("emoji", "🎉")),
    ),
]

# vLLM tests/tool_parsers/test_glm47_moe_tool_parser.py, commit
# 0ce879769db6d7503db0ecdfb5b503b080720347 (TestGlm47ExtractToolCalls), model outputs verbatim.
BEIJING_47 = glm_call("get_weather", ("city", "Beijing"), sep="")
GLM47_VLLM = [
    Case("vllm47_no_tool_call", "This is a plain response."),
    Case("vllm47_zero_arg_inline", "<tool_call>get_current_date</tool_call>"),
    Case("vllm47_zero_arg_newline", "<tool_call>get_current_date\n</tool_call>"),
    Case("vllm47_args_same_line", BEIJING_47),
    Case("vllm47_args_with_newlines", glm_call("get_weather", ("city", "Beijing"))),
    Case("vllm47_content_before", "Checking.<tool_call>get_current_date</tool_call>"),
    Case("vllm47_multiple", BEIJING_47 + BEIJING_47.replace("Beijing", "Shanghai")),
    Case("vllm47_whitespace_content_none", "  \n  <tool_call>get_current_date</tool_call>"),
]

READ = glm_call("read_file", ("path", "src/a.py"), ("line", "3"))
READ_47 = glm_call("read_file", ("path", "src/a.py"), ("line", "3"), sep="")

# What GLM-4.5/4.6/4.7 commonly write around their calls.
GLM_MALFORMED = [
    Case("call_before_think_close", f"<think>I should read it.\n{READ}</think>"),
    Case("call_before_think_close_then_text", f"<think>Hm{READ_47}</think>Reading it."),
    Case("call_in_never_closed_reasoning", f"\n<think>Let me read the file.\n{READ}"),
    Case("glm47_prompt_opened_think_call_first", f"Plan.{READ_47}</think>", reasoning_open=True),
    Case("call_closer_missing_at_end", "Reading.\n" + READ.removesuffix("</tool_call>")),
    Case("arg_key_padded", READ.replace("<arg_key>path</arg_key>", "<arg_key> path\n</arg_key>")),
    Case("string_value_like_json", glm_call("read_file", ("path", "123"), ("line", "7"))),
    Case(
        "object_value",
        glm_call("read_file", ("path", "a.py"), ("options", '{"follow": true, "depth": 2}')),
    ),
    Case("call_closer_missing_mid_output", READ.removesuffix("\n</tool_call>") + "\n" + BEIJING),
    Case("value_closer_missing", READ.replace("src/a.py</arg_value>", "src/a.py")),
    Case("key_closer_missing", READ.replace("path</arg_key>", "path")),
    Case(
        "argument_given_twice",
        READ.replace(
            "</tool_call>", "<arg_key>line</arg_key>\n<arg_value>4</arg_value>\n</tool_call>"
        ),
    ),
    Case("text_after_a_value", READ.replace("3</arg_value>", "3</arg_value> (line 3)")),
    Case("value_cut_off", READ[: READ.index("src/a") + 5]),
    Case("undeclared_tool", glm_call("list_files", ("path", "src"))),
]


# What GLM-5 and GLM-5.1 write after their generation prompt's <think> (vLLM serves them with the
# same parser engine, as `glm47`/`glm45`): the model closes the block, empty where it does not
# reason (renderers' GLM-5 renderer: `</think>` sampled after the prompt's `<think>`).
GLM5_OUTPUTS = [
    Case("glm5_empty_reasoning_answer", "</think>Done.", reasoning_open=True),
    Case("glm5_empty_reasoning_call", f"</think>{READ_47}", reasoning_open=True),
    Case(
        "glm5_reasoning_text_and_calls",
        f"Both.</think>Checking.{READ_47}{BEIJING_47}",
        reasoning_open=True,
    ),
]


def glm_bases() -> list[tuple[str, bool]]:
    return [
        (f"\n<think>Read it first.</think>\n{READ}", False),
        (f"\n<think>Both.</think>\nLet me check.\n{READ}\n{BEIJING}", False),
        (f"Two files.</think>{READ_47}{BEIJING_47}", True),  # GLM-4.7, thinking on
        (DALLAS, False),
    ]


def late_think(text: str, rng: random.Random) -> str:
    """The reasoning closed after the calls rather than before them."""
    last = text.rfind("</tool_call>")
    if last < 0 or "</think>" not in text[:last]:
        return text
    text = text.replace("</think>", "", 1)
    end = last - len("</think>") + len("</tool_call>")
    return text[:end] + "</think>" + text[end:]


glm_mutate = mutator(
    "<tool_call>",
    ["</tool_call>", "</arg_value>", "</arg_key>", "</think>", "<tool_call>"],
    r"</?(tool_call|arg_key|arg_value|think)>",
    reorder=swapping(r"\s*<arg_key>[^<]*</arg_key>\s*<arg_value>[^<]*</arg_value>"),
    other=late_think,
)


def glm_blocks(text: str) -> list[str]:
    """Each call block: from its <tool_call> to the next <tool_call> or the end."""
    return text.split("<tool_call>")[1:]


def glm_cut_in_a_call(text: str) -> bool:
    """The output ends inside a call, after its name and before a closed last argument."""
    if not glm_blocks(text):
        return False
    last = glm_blocks(text)[-1]
    return "</tool_call>" not in last and not re.search(r"(</arg_value>|^[^<]*)\s*$", last)


def glm_tags_unbalanced(text: str) -> bool:
    """A call block missing one of its arguments' tags."""
    return any(
        block.count("<arg_key>") != block.count("</arg_key>")
        or block.count("<arg_value>") != block.count("</arg_value>")
        or block.count("<arg_key>") != block.count("<arg_value>")
        for block in (b.partition("</tool_call>")[0] for b in glm_blocks(text))
    )


def glm_keys(block: str) -> list[str]:
    return [k.strip() for k in re.findall(r"<arg_key>([^<>]*)</arg_key>", block)]


def glm_text_between(text: str) -> bool:
    """Text other than whitespace between a call's arguments, or after its last one."""
    for block in glm_blocks(text):
        body = re.sub(r"^[^<]*", "", block.partition("</tool_call>")[0], count=1)
        rest = re.sub(r"\s*<arg_key>[^<>]*</arg_key>\s*<arg_value>.*?</arg_value>", "", body)
        if rest.strip():
            return True
    return False


def glm_merged(text: str, calls: list[Call]) -> bool:
    """vLLM extracts fewer calls than the output opens: a call missing its </tool_call> read on
    into the next one."""
    blocks = glm_blocks(text)
    return len(calls) < len(blocks) and any("</tool_call>" not in b for b in blocks[:-1])


DECLARED = {tool_["function"]["name"] for tool_ in GLM_TOOLS}

GLM_DIFFERENCES = (
    Difference(
        "cut_off_call",
        "the output ends inside a call (in a tag, a key or a value): vLLM extracts it with the "
        "cut argument dropped or partial; titoflow returns the cut call as text with "
        "parse_error rather than call with an argument missing or guessed",
        lambda text, calls: glm_cut_in_a_call(text),
    ),
    Difference(
        "call_closer_missing_mid_output",
        "a call missing its </tool_call> with another call after it: vLLM reads the first call "
        "on into the next, merging both calls' arguments into one call; titoflow ends the call "
        "where the next <tool_call> opens, two calls as written",
        glm_merged,
        refusal=False,
    ),
    Difference(
        "argument_tag_missing",
        "an argument missing one of its tags (</arg_value>, </arg_key>, <arg_value>): vLLM reads "
        "a key or value on across the next argument's tags (a key or value holding them, an "
        "argument lost); titoflow refuses rather than call with the arguments run together",
        lambda text, calls: glm_tags_unbalanced(text),
    ),
    Difference(
        "argument_given_twice",
        "vLLM keeps the last value of an argument written twice; titoflow does not guess which",
        lambda text, calls: any(len(set(glm_keys(b))) < len(glm_keys(b)) for b in glm_blocks(text)),
    ),
    Difference(
        "text_between_arguments",
        "text other than whitespace between a call's arguments: vLLM drops it and calls the "
        "tool; titoflow refuses, the text being something the model meant that the call loses",
        lambda text, calls: glm_text_between(text),
    ),
    Difference(
        "undeclared_tool",
        "a call to a tool the request does not declare: vLLM drops the call (its names are "
        "checked against the request's tools), the model's call lost; titoflow returns it as "
        "written, for the client to answer as it answers any failed call",
        lambda text, calls: any(
            (m := re.match(r"\s*([^\s<>]+)", b)) is not None and m.group(1) not in DECLARED
            for b in glm_blocks(text)
        ),
        refusal=False,
    ),
)


FAMILY = Family(
    "glm45",
    "glm45",
    "glm45",
    GLM_TOOLS,
    ("<tool_call>",),
    GLM_DIFFERENCES,
    GLM4_VLLM + GLM47_VLLM + GLM_MALFORMED + GLM5_OUTPUTS,
    mutants(glm_bases(), glm_mutate, 80),
)

READS = {
    "call_before_think_close": ["read_file"],
    "call_before_think_close_then_text": ["read_file"],
    "call_in_never_closed_reasoning": ["read_file"],
    "glm47_prompt_opened_think_call_first": ["read_file"],
    "call_closer_missing_at_end": ["read_file"],
    "arg_key_padded": ["read_file"],
    "glm5_empty_reasoning_call": ["read_file"],
    "glm5_reasoning_text_and_calls": ["read_file", "get_weather"],
}
