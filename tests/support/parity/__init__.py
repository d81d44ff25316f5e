"""The harness of the parser parity test (``tests/titoflow/tito/test_parser_parity.py``): what a
case, a family and a declared difference are, the engine-side script that runs vLLM's parsers,
and the mutations and differences the families' modules share. One module per family beside it
holds that family's cases and declared differences (``FAMILY``) and the malformed outputs these
models commonly write that it must read as calls, without error (``READS``: case name to the
names of its calls)."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# (name, arguments as JSON text) of one call.
Call = tuple[str, str]

ENGINE = """
import json, os, sys
from transformers import AutoTokenizer
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager
from vllm.reasoning import ReasoningParserManager
from vllm.tokenizers import get_tokenizer
from vllm.tool_parsers import ToolParserManager


def harmony_calls(tok, job):
    # vLLM serves gpt-oss through HarmonyParser, composed as its chat server composes it; it
    # reads the output's token ids with openai-harmony, whose o200k_base ranks the family's
    # tokenizer directory holds (so nothing is downloaded).
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = job["tokenizer"]
    parser = ParserManager.get_parser(
        job["tool_parser"], job["reasoning_parser"], enable_auto_tools=True, is_harmony=True
    )(tok, job["tools"])
    request = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "x"}], tools=job["tools"]
    )
    results = []
    for text in job["texts"]:  # parse() resets the parser when it ends
        ids = tok.encode(text, add_special_tokens=False)
        calls = parser.parse(text, request, enable_auto_tools=True, model_output_token_ids=ids)[2]
        results.append([[c.name, c.arguments] for c in calls or []])
    return results


out = {}
for family, job in json.load(sys.stdin).items():
    if job["tokenizer_mode"] == "mistral":
        # vLLM's MistralTokenizer over the directory's tekken.json, as its mistral mode serves it.
        tok = get_tokenizer(job["tokenizer"], tokenizer_mode="mistral")
    else:
        tok = AutoTokenizer.from_pretrained(job["tokenizer"])
    if job["harmony"]:
        out[family] = harmony_calls(tok, job)
        continue
    tools = ToolParserManager.get_tool_parser(job["tool_parser"])
    reasoning = job["reasoning_parser"]
    reasoning = reasoning and ReasoningParserManager.get_reasoning_parser(reasoning)
    request = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "x"}], tools=job["tools"]
    )
    # One parser each (building one reads the whole vocabulary); a whole-text parse keeps no
    # state from the one before (checked: the same results as a fresh parser per text).
    tool_parser = tools(tok)
    reasoning_parser = reasoning and reasoning(tok)
    results = []
    for text in job["texts"]:
        content = text
        if reasoning:
            content = reasoning_parser.extract_reasoning(text, request)[1] or ""
        info = tool_parser.extract_tool_calls(content, request)
        calls = info.tool_calls if info.tools_called else []
        results.append([[c.function.name, c.function.arguments] for c in calls])
    out[family] = results
print(json.dumps(out))
"""


def tool(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


# The tools most families' cases call, and the arguments of their ``read_file`` call.
GET_WEATHER = tool("get_weather", {"city": {"type": "string"}})
READ_FILE = tool("read_file", {"path": {"type": "string"}, "line": {"type": "integer"}})
READ_ARGUMENTS = '{"path": "src/a.py", "line": 3}'


@dataclass(frozen=True)
class Case:
    name: str
    text: str
    reasoning_open: bool = False  # the prompt opened <think> (K2.5)


@dataclass(frozen=True)
class Difference:
    """A declared way titoflow differs from vLLM, for ``reason``, on the outputs ``applies``
    recognises (given the text and vLLM's calls). A refusal (the usual kind): titoflow's calls
    are some of vLLM's, in order, the rest refused with ``parse_error``."""

    name: str
    reason: str
    applies: Callable[[str, list[Call]], bool]
    refusal: bool = True


@dataclass(frozen=True)
class Family:
    name: str
    tool_parser: str
    reasoning_parser: str | None
    tools: list[dict[str, Any]]
    markers: tuple[str, ...]  # text holding one of these is call-shaped
    differences: tuple[Difference, ...]  # the first that applies names a case: the specific first
    fixed: list[Case]
    mutants: list[Case]
    # vLLM parses the output from its token ids with its harmony parser (gpt-oss), not the text
    # with extract_reasoning and extract_tool_calls: ENGINE encodes the text with the tokenizer.
    harmony: bool = False
    # vLLM's parsers are given vLLM's own MistralTokenizer over this tekken file (its mistral
    # tokenizer mode), not the family's directory as AutoTokenizer loads it.
    tekken: Callable[[], dict[str, Any]] | None = None


def recovery_cases(block: str, full: bool) -> list[Case]:
    """vLLM tests/reasoning/test_qwen3_tool_call_recovery.py, commit
    50e9a157fa59b72ad3b91662dce21f15711a6762 (issue 39056: Qwen3.5 writing its XML call inside
    <think>): its outputs verbatim, the call ``block`` inside the reasoning; ``full`` adds the
    two whose text after the reasoning is the point."""
    cases = [
        Case(
            "vllm_embedded_tool_call_promoted_from_reasoning",
            "<think>The verification confirms my solution:\n- s = 2.5 km/h\n- t = 24 minutes\n"
            "- Total time at speed 3 km/h = 204 minutes\n\n" + block + "\n</think>",
        ),
        Case(
            "vllm_existing_content_preserved_after_promotion",
            "<think>verify result\n" + block + "</think>Here is the answer.",
        ),
        Case(
            "vllm_promoted_tool_call_parseable_trailing_text",
            "<think>verify result\n" + block + "</think>assistant trailing text",
        ),
        # Cut off before </think> with no <think> written: the prompt opened it.
        Case("vllm_truncated_reasoning_recovers_tool_call", "verify result\n" + block, True),
        Case(
            "vllm_normal_reasoning_unchanged",
            "<think>Let me think about this carefully.\nThe answer is 42.</think>The answer is 42.",
        ),
        Case(
            "vllm_post_think_content_preserved", "<think>some reasoning</think>plain response text"
        ),
    ]
    kept_only_in_full = (
        "vllm_promoted_tool_call_parseable_trailing_text",
        "vllm_post_think_content_preserved",
    )
    return cases if full else [c for c in cases if c.name not in kept_only_in_full]


def json_object(arguments: str) -> bool:
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


def cut_after(text: str, marker: str, rng: random.Random) -> str:
    """``text`` cut at random after the start of its first ``marker`` (unchanged without one):
    an output the generation ended inside a call."""
    start = text.find(marker)
    return text[: rng.randrange(start + 1, len(text))] if start >= 0 else text


def drop_one(text: str, marker: str, rng: random.Random) -> str:
    """``text`` without one of its ``marker``s, chosen at random (unchanged without one)."""
    spots = [m.start() for m in re.finditer(re.escape(marker), text)]
    if not spots:
        return text
    at = rng.choice(spots)
    return text[:at] + text[at + len(marker) :]


def space_after(text: str, pattern: str, rng: random.Random) -> str:
    """``text`` with whitespace added after one match of ``pattern``, chosen at random."""
    ends = [m.end() for m in re.finditer(pattern, text)]
    if not ends:
        return text
    at = rng.choice(ends)
    return text[:at] + rng.choice([" ", "\n", "\n\n", "  \n "]) + text[at:]


def swap_two(text: str, pattern: str, rng: random.Random) -> str:
    """``text`` with two of its ``pattern`` matches (a call's parameters), chosen at random,
    in each other's place (unchanged with fewer than two)."""
    found = re.findall(pattern, text, re.DOTALL)
    if len(found) < 2:
        return text
    first, second = rng.sample(found, 2)
    return text.replace(first, "\0").replace(second, first).replace("\0", second)


def parameters_lost(text: str, calls: list[Call]) -> bool:
    """vLLM's calls hold fewer parameters than the text begins (``<parameter``)."""
    found = sum(len(json.loads(arguments)) for _, arguments in calls if json_object(arguments))
    return found < text.count("<parameter")


def parameter_given_twice(applies: Callable[[str, list[Call]], bool]) -> Difference:
    """The difference on a call naming one parameter twice, recognised by ``applies``."""
    return Difference(
        "parameter_given_twice",
        "vLLM keeps the last value of a parameter written twice; titoflow does not guess which",
        applies,
    )


def names_a_parameter_twice(name: str, call: str) -> Callable[[str, list[Call]], bool]:
    """Whether a call (the text from one ``call`` to the next) names a parameter twice, each
    parameter's name being the group of the pattern ``name``."""

    def applies(text: str, calls: list[Call]) -> bool:
        for block in text.split(call):
            names = re.findall(name, block)
            if len(set(names)) < len(names):
                return True
        return False

    return applies


def cut_inside_a_tag(examples: str) -> Difference:
    """The difference on an output that ends inside a tag, ``examples`` of which name it."""
    return Difference(
        "cut_inside_a_tag",
        f"the output ends inside a tag ({examples}): vLLM drops the partial tag and calls the "
        "tool; titoflow refuses, the model having been cut off writing more of the call",
        lambda text, calls: re.search(r"<[^>]*$", text) is not None,
    )


def value_end_unknown(closer: str) -> Difference:
    """The difference on a parameter with no known end, its value running into ``closer``
    (a call's)."""
    return Difference(
        "value_end_unknown",
        "a parameter with no known end (cut off in its name or value, or its value running "
        f"into {closer}): vLLM drops the parameter and calls the tool without it; titoflow "
        "refuses rather than call with an argument missing or guessed",
        parameters_lost,
    )


def xml_parameter_differences(
    name: str, call: str, closer: str, cut: str
) -> tuple[Difference, ...]:
    """The differences the families writing XML parameters declare first: a parameter given
    twice (its name the group of ``name``, within each ``call``), a value with no known end
    (running into ``closer``), and an output cut inside a tag (``cut`` names examples)."""
    return (
        parameter_given_twice(names_a_parameter_twice(name, call)),
        value_end_unknown(closer),
        cut_inside_a_tag(cut),
    )


Mutate = Callable[[str, random.Random], str]


def mutator(
    opener: str,
    closers: Sequence[str],
    spaced: str,
    reorder: Mutate | None = None,
    other: Mutate | None = None,
) -> Mutate:
    """The mutation most families' seeded cases are made with, one kind drawn at random each
    time: the output cut after its first ``opener``, one of ``closers`` dropped, whitespace
    after a match of the pattern ``spaced``, and, where given, the call's arguments reordered
    (``reorder``) and the family's own (``other``)."""
    kinds = ["truncate", "drop", "space"] + ["reorder"] * bool(reorder) + ["other"] * bool(other)

    def mutate(text: str, rng: random.Random) -> str:
        kind = rng.choice(kinds)
        if kind == "truncate":
            return cut_after(text, opener, rng)
        if kind == "drop":
            return drop_one(text, rng.choice(closers), rng)
        if kind == "space":
            return space_after(text, spaced, rng)
        given = reorder if kind == "reorder" else other
        assert given is not None  # drawn only when given
        return given(text, rng)

    return mutate


def read_file_keys_swapped(text: str, rng: random.Random) -> str:
    """The ``read_file`` call's JSON arguments (:data:`READ_ARGUMENTS`), keys swapped."""
    return text.replace(READ_ARGUMENTS, '{"line": 3, "path": "src/a.py"}')


def swapping(pattern: str) -> Mutate:
    """Two of the output's ``pattern`` matches (a call's parameters) swapped: :func:`swap_two`."""
    return lambda text, rng: swap_two(text, pattern, rng)


def mutants(bases: list[tuple[str, bool]], mutate: Mutate, count: int) -> list[Case]:
    """``count`` cases, each one of the well-formed outputs ``bases`` (its text, and whether
    the prompt opened the reasoning) mutated once or twice."""
    rng = random.Random(37)  # issue 37: fixed, so a failure names a reproducible case
    cases = []
    for number in range(count):
        text, reasoning_open = rng.choice(bases)
        for _ in range(rng.choice([1, 1, 2])):
            text = mutate(text, rng)
        cases.append(Case(f"mutant_{number}", text, reasoning_open))
    return cases
