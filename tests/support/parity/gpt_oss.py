"""gpt-oss's cases for the parser parity test. vLLM parses gpt-oss output with its harmony
parser (``vllm/parser/harmony.py``, composed from the ``openai`` tool parser and the
``openai_gptoss`` reasoning parser, both stubs on their own): it reads the output's token ids, not
its text, with openai-harmony's ``StreamableParser``. So the family is ``harmony``: the engine
script encodes each text with the real ``o200k_harmony`` tokenizer (the family's directory, which
also holds the ``o200k_base`` ranks openai-harmony loads, offline) and calls ``parse`` as vLLM's
chat server does. The texts are what follows the generation prompt's ``<|start|>assistant``; the
stop token is left off where titoflow's ingress removes it (vLLM reads the same calls either
way)."""

from __future__ import annotations

import random
import re

from tests.support.parity import (
    GET_WEATHER,
    READ_ARGUMENTS,
    READ_FILE,
    Case,
    Difference,
    Family,
    json_object,
    mutants,
    mutator,
    read_file_keys_swapped,
    tool,
)

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
CONSTRAIN, END, CALL, RETURN = "<|constrain|>", "<|end|>", "<|call|>", "<|return|>"

GPT_OSS_TOOLS = [
    tool("get_current_weather", {"location": {"type": "string"}}),
    GET_WEATHER,
    READ_FILE,
]

# vLLM tests/parser/test_harmony.py, commit 06cbadc2c809be0d442da52380453f6bb69e766a (TestParse,
# and TestParseDelta's outputs whole): the raw outputs verbatim; the rendered ones
# (get_model_output_tokens) as openai-harmony renders those messages after <|start|>assistant.
GPT_OSS_VLLM = [
    Case("vllm_reasoning_only", "<|channel|>analysis<|message|>This is reasoning<|end|>"),
    Case("vllm_content_only", "<|channel|>final<|message|>This is a test<|end|>"),
    Case(
        "vllm_single_tool_call_commentary",
        " to=functions.get_current_weather<|channel|>commentary json<|message|>"
        '{"location": "Tokyo"}<|call|>',
    ),
    Case(
        "vllm_single_tool_call_analysis_newlines",
        " to=functions.get_current_weather<|channel|>analysis json<|message|>"
        '{\n"location": "Tokyo"\n}<|call|>',
    ),
    Case(
        "vllm_multiple_tool_calls_varied_formats",
        ' to=functions.get_current_weather<|channel|>commentary json<|message|>{"location": '
        '"Tokyo"}<|call|><|start|>assistant to=functions.get_user_location<|channel|>commentary'
        ' json<|message|>{"location": "Tokyo"}<|call|><|start|>assistant '
        'to=functions.no_content_type<|channel|>commentary<|message|>{"location": "Tokyo"}'
        "<|call|><|start|>assistant to=functions.not_json_no_content_type<|channel|>commentary"
        "<|message|>foo<|call|><|start|>assistant to=functions.empty_args<|channel|>commentary"
        " json<|message|>{}<|call|><|start|>assistant to=functions.no_args<|channel|>commentary"
        " json<|message|><|call|>",
    ),
    Case(
        "vllm_tool_call_bare_recipient",
        ' to=get_current_weather<|channel|>commentary json<|message|>{"location": "Tokyo"}<|call|>',
    ),
    Case(
        "vllm_assistant_recipient_not_tool",
        " to=assistant<|channel|>commentary<|message|>Some tool response<|call|><|start|>"
        "assistant<|channel|>final<|message|>Here is the answer<|end|>",
    ),
    Case(
        "vllm_tool_call_dotted_name",
        ' to=math.sum<|channel|>commentary json<|message|>{"a": 2, "b": 3}<|call|>',
    ),
    Case(
        "vllm_tool_calls_with_final_content",
        "<|channel|>analysis<|message|>User asked about the weather.<|end|><|start|>assistant "
        "to=functions.get_current_weather<|channel|>commentary json<|message|>"
        '{"location": "Tokyo"}<|call|><|start|>assistant<|channel|>final<|message|>This tool '
        "call will get the weather.<|end|>",
    ),
    Case(
        "vllm_interrupted_first_message",
        "<|channel|>final<|message|>I'm in the middle of answering",
    ),
    Case(
        "vllm_truncated_output",
        "<|channel|>analysis<|message|>I'm thinking.<|end|><|start|>assistant<|channel|>final"
        "<|message|>I'm in the middle of answering",
    ),
    Case(
        "vllm_malformed_msgs_recovers_raw_content",
        "<|channel|>analysis<|message|>thinking<|end|><|start|>assistant<|channel|>commentary"
        '<|message|>thinking<|end|><|start|>assistant<|channel|>final {"answer": "hi"}'
        "<|return|>",
    ),
    Case(
        "vllm_commentary_preambles",
        "<|channel|>commentary<|message|>Let me look that up.<|end|><|start|>assistant"
        "<|channel|>final<|message|>The answer is 42.<|end|>",
    ),
    Case(
        "vllm_commentary_with_recipient_excluded",
        "<|channel|>commentary<|message|>Let me check the weather.<|end|><|start|>assistant "
        'to=functions.get_weather<|channel|>commentary<|message|>{"location": "SF"}<|end|>',
    ),
    Case(
        "vllm_tool_call_split_across_deltas",
        "<|channel|>analysis<|message|>Thinking<|end|><|start|>assistant to=functions.get_weather"
        '<|channel|>commentary<|constrain|>json<|message|>{"location": "Paris"}<|call|>',
    ),
    Case(
        "vllm_builtin_recipient_skipped",
        " to=browser<|channel|>commentary<|message|>Ignore this<|call|>",
    ),
    Case(
        "vllm_cross_channel_with_tool",
        "<|channel|>analysis<|message|>Reasoning about query...<|end|><|start|>assistant "
        'to=functions.search<|channel|>commentary<|constrain|>json<|message|>{"query": "vllm"}'
        "<|call|><|start|>assistant<|channel|>final<|message|>Done",
    ),
    Case(
        "vllm_multi_tool_interleaved",
        "<|channel|>analysis<|message|>Plan<|end|><|start|>assistant to=functions.tool_a"
        '<|channel|>commentary<|constrain|>json<|message|>{"a": 1}<|call|><|start|>assistant '
        'to=functions.tool_b<|channel|>commentary<|constrain|>json<|message|>{"b": 2}<|call|>'
        "<|start|>assistant<|channel|>final<|message|>Done<|end|><|start|>assistant "
        'to=functions.tool_c<|channel|>commentary<|constrain|>json<|message|>{"c": 3}',
    ),
]


def analysis(text: str) -> str:
    """An analysis message and the next message's start, as gpt-oss writes them."""
    return f"{CHANNEL}analysis{MESSAGE}{text}{END}{START}assistant"


def commentary(header: str, body: str) -> str:
    """A commentary message, ``header`` between its channel and ``<|message|>``."""
    return f"{CHANNEL}commentary{header}{MESSAGE}{body}"


def call(name: str, arguments: str) -> str:
    """A call as gpt-oss writes it (the recipient after the channel, ``<|constrain|>json``)."""
    return commentary(f" to=functions.{name} {CONSTRAIN}json", arguments)


WEATHER = call("get_weather", '{"city": "Tokyo"}')
READ = call("read_file", READ_ARGUMENTS)
OSLO = '{"city": "Oslo"}'

# What gpt-oss commonly writes around its calls. The engine stops on <|call|>, which titoflow's
# ingress removes; a cut-off output has no stop token.
GPT_OSS_MALFORMED = [
    Case("call_after_analysis", analysis("Check the weather.") + WEATHER),
    Case("call_first", WEATHER),
    Case("call_with_its_stop_token", analysis("r") + WEATHER + CALL),
    Case("call_ended_with_end", analysis("r") + WEATHER + END),
    Case(
        "template_form",
        analysis("r") + f" to=functions.get_weather{CHANNEL}commentary json{MESSAGE}{OSLO}",
    ),
    Case(
        "constrain_without_space",
        analysis("r") + commentary(f" to=functions.get_weather{CONSTRAIN}json", OSLO),
    ),
    Case("no_content_type", analysis("r") + commentary(" to=functions.get_weather", OSLO)),
    Case("other_content_type", analysis("r") + commentary(" to=functions.get_weather code", OSLO)),
    Case(
        "call_in_analysis_channel",
        analysis("r") + f"{CHANNEL}analysis to=functions.get_weather json{MESSAGE}{OSLO}",
    ),
    Case(
        "call_in_final_channel",
        analysis("r") + f"{CHANNEL}final to=functions.read_file{MESSAGE}" + '{"path": "b"}',
    ),
    # The channel again after the recipient: older openai-harmony made the tool name
    # "write_file<|channel|>commentary" of it (a malformed name reported from gpt-oss runs).
    Case(
        "channel_repeated_after_recipient",
        analysis("r") + commentary(f" to=functions.get_weather{CHANNEL}commentary json", OSLO),
    ),
    Case("spaces_in_header", analysis("r") + commentary("  to=functions.get_weather  json ", OSLO)),
    Case(
        "newline_before_role",
        f"{CHANNEL}analysis{MESSAGE}r{END}{START}\nassistant" + WEATHER,
    ),
    Case("hyphen_in_name", analysis("r") + call("web-browsing", '{"q": "x"}')),
    Case(
        "preamble_then_call",
        analysis("r") + f"{CHANNEL}commentary{MESSAGE}Checking.{END}{START}assistant" + WEATHER,
    ),
    Case("builtin_tool_recipient", analysis("r") + commentary(" to=browser.search", '{"q": "x"}')),
    Case("final_json_content_type", f"{CHANNEL}final json{MESSAGE}" + '{"answer": 42}'),
    Case("start_assistant_missing", f"{CHANNEL}analysis{MESSAGE}r{END}" + WEATHER),
    Case("start_missing", f"{CHANNEL}analysis{MESSAGE}r{END}assistant" + WEATHER),
    Case("end_missing_before_call", f"{CHANNEL}analysis{MESSAGE}r{START}assistant" + WEATHER),
    Case("arguments_cut_off", analysis("r") + call("read_file", '{"path": "src/a')),
    Case(
        "header_cut_off",
        analysis("r") + f"{CHANNEL}commentary to=functions.read_file {CONSTRAIN}js",
    ),
    Case(
        "header_without_message",
        analysis("r") + f"{CHANNEL}commentary to=functions.get_weather{CALL}",
    ),
    Case(
        "constrain_apart_from_type",
        analysis("r") + commentary(f" to=functions.get_weather {CONSTRAIN} json", OSLO),
    ),
    Case("arguments_not_an_object", analysis("r") + call("get_weather", '["Tokyo"]')),
    Case("arguments_invalid_json", analysis("r") + call("get_weather", "{city: Tokyo}")),
    Case("whitespace_around_arguments", analysis("r") + call("get_weather", f"\n {OSLO} \n")),
    Case("reasoning_cut_off", f"{CHANNEL}analysis{MESSAGE}I should call get_weather"),
    Case("final_answer", analysis("Easy.") + f"{CHANNEL}final{MESSAGE}It is sunny."),
]


def gpt_oss_bases() -> list[tuple[str, bool]]:
    template = f" to=functions.read_file{CHANNEL}commentary json{MESSAGE}"
    preamble = f"{CHANNEL}commentary{MESSAGE}Reading.{END}{START}assistant"
    return [
        (analysis("Let me check.") + WEATHER, False),
        (analysis("Read it.") + READ, False),
        (analysis("Two steps.") + preamble + READ, False),
        (WEATHER + CALL, False),
        (analysis("r") + template + READ_ARGUMENTS, False),
    ]


def other_channel(text: str, rng: random.Random) -> str:
    channel = rng.choice(["analysis to=", "final to=", "commentary  to="])
    return text.replace("commentary to=", channel, 1)


gpt_oss_mutate = mutator(
    "to=functions.",
    [END, START, CONSTRAIN, MESSAGE, "assistant", "}"],
    r"\|>|\}|json",
    reorder=read_file_keys_swapped,
    other=other_channel,
)


def unstarted_call(text: str) -> bool:
    """A call header after a message's end without the ``<|start|>`` every later message
    begins with."""
    for end in re.finditer(r"<\|(?:end|call|return)\|>(?!<\|start\|>)", text):
        if "to=functions." in text[end.end() :].split(START, 1)[0]:
            return True
    return False


GPT_OSS_DIFFERENCES = (
    Difference(
        "arguments_not_a_json_object",
        "vLLM passes a call's body through as written, invalid JSON (a cut-off call), empty, or "
        "not an object; titoflow's calls carry a JSON object (what the template renders and "
        "clients parse), so it returns that message as text with parse_error",
        lambda text, calls: any(not json_object(arguments) for _, arguments in calls),
    ),
    Difference(
        "recipient_not_functions",
        "a message addressed to a bare or dotted name (to=get_weather, to=math.sum): vLLM "
        "takes any recipient but assistant and the built-in tools as a function; titoflow reads "
        "only to=functions.NAME as a call (the namespace gpt-oss is given its functions in, and "
        "the one history renders back), returning that message as text with parse_error",
        lambda text, calls: any(f"to=functions.{name}" not in text for name, _ in calls),
    ),
    Difference(
        "content_type_taken_for_recipient",
        "a lone word after the channel (<|channel|>final json, the form vLLM's own "
        "structured-output grammar lets the model write): openai-harmony reads it as the "
        "recipient and vLLM makes a call named 'json' of the answer; titoflow reads the content "
        "type, the message content",
        lambda text, calls: any(f"to={name}" not in text for name, _ in calls),
        refusal=False,
    ),
    Difference(
        "call_without_start",
        "a call header right after a message's end, without <|start|>assistant: openai-harmony "
        "fails on every token until a <|start|> and vLLM skips them, the call and all after it "
        "lost; titoflow reads the header as it reads the first one (the output's own message)",
        lambda text, calls: not calls and unstarted_call(text),
        refusal=False,
    ),
)


FAMILY = Family(
    "gpt_oss",
    "openai",
    "openai_gptoss",
    GPT_OSS_TOOLS,
    ("to=",),  # a message addressed to a recipient
    GPT_OSS_DIFFERENCES,
    GPT_OSS_VLLM + GPT_OSS_MALFORMED,
    mutants(gpt_oss_bases(), gpt_oss_mutate, 80),
    harmony=True,
)

READS = {
    "channel_repeated_after_recipient": ["get_weather"],
    "spaces_in_header": ["get_weather"],
    "newline_before_role": ["get_weather"],
}
