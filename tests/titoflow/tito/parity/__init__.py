"""The harness of the parser parity test (``tests/titoflow/tito/test_parser_parity.py``): what a
case,
a family and a declared difference are, the engine-side script that runs vLLM's parsers, and the
mutations every family's seeded cases are made with. One module per family beside it holds that
family's cases and declared differences (``FAMILY``) and the malformed outputs it must read as
calls (``READS``)."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
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
    differences: tuple[Difference, ...]
    fixed: list[Case]
    mutants: list[Case]
    # vLLM parses the output from its token ids with its harmony parser (gpt-oss), not the text
    # with extract_reasoning and extract_tool_calls: ENGINE encodes the text with the tokenizer.
    harmony: bool = False


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


def mutants(
    bases: list[tuple[str, bool]], mutate: Callable[[str, random.Random], str], count: int
) -> list[Case]:
    rng = random.Random(37)  # issue 37: fixed, so a failure names a reproducible case
    cases = []
    for number in range(count):
        text, reasoning_open = rng.choice(bases)
        for _ in range(rng.choice([1, 1, 2])):
            text = mutate(text, rng)
        cases.append(Case(f"mutant_{number}", text, reasoning_open))
    return cases
