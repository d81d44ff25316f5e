"""titoflow's tool-call parsers agree with vLLM's on what a model output calls: the same texts
go to titoflow's parser and to vLLM's, run in the engine environment (``Settings().engine_python``)
by one subprocess for the module. Each family's cases and declared differences are in its module of
``tests/support/parity`` (which says what tokenizer vLLM's parser is given and why).

Invariant checked on every case: where vLLM extracts calls, titoflow extracts the same names
and JSON-equal arguments, unless the case is one of the family's declared differences (each a
refusal, with its reason, titoflow's result then carrying ``parse_error``); titoflow extracts
no call vLLM does not; call-shaped text titoflow leaves as content always carries
``parse_error``; and titoflow's streamed parse (one character at a time) equals its whole one.
Content, reasoning and call ids are not compared: vLLM drops text after a Kimi section and
strips whitespace, and titoflow keeps text exactly as generated and Kimi's ids as written.

The cases: vLLM's own parser tests for the family (model outputs copied as data, source named
at each list), the malformed outputs these models commonly write, and seeded random mutations
of well-formed calls (truncation, dropped closers, extra whitespace, reordered keys).
vLLM's parsers take a tokenizer: each family's is the directory
:func:`cli.dev.tokenizers.tokenizer_dir` builds, loaded with ``AutoTokenizer``, or, for a family
whose module names a ``tekken`` file (Magistral), vLLM's own ``MistralTokenizer`` over it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from cli.dev.tokenizers import tokenizer_dir
from tests.support.engine_env import run_in_engine
from tests.support.parity import (
    ENGINE,
    Call,
    Case,
    Family,
    deepseek_v3,
    deepseek_v4,
    deepseek_v32,
    gemma3,
    gemma4,
    glm45,
    gpt_oss,
    hermes,
    json_object,
    kimi_k2,
    llama3,
    llama4,
    magistral,
    magistral_v13,
    minimax_m2,
    mistral,
    mistral_v11,
    nemotron3,
    qwen3,
    qwen3_coder,
    qwen35,
    seed_oss,
)
from titoflow.tito.families import family_named
from titoflow.tito.families.base import ParserOptions
from titoflow.tito.output import ParsedOutput

MODULES = (
    kimi_k2,
    qwen3_coder,
    qwen35,
    nemotron3,
    mistral,
    mistral_v11,
    magistral,
    magistral_v13,
    glm45,
    deepseek_v3,
    deepseek_v32,
    deepseek_v4,
    qwen3,
    hermes,
    llama3,
    gpt_oss,
    minimax_m2,
    llama4,
    gemma3,
    gemma4,
    seed_oss,
)
FAMILIES = {module.FAMILY.name: module.FAMILY for module in MODULES}


def cases_of(family: Family) -> list[Case]:
    return family.fixed + family.mutants


def engine_tokenizer(family: Family, scratch: pytest.TempPathFactory) -> tuple[str, str]:
    """The directory vLLM's parsers load their tokenizer from, and the tokenizer mode."""
    if family.tekken is None:
        return str(tokenizer_dir(family.name)), "auto"
    path = scratch.mktemp(f"{family.name}-tekken")
    (path / "tekken.json").write_text(json.dumps(family.tekken(), ensure_ascii=False))
    return str(path), "mistral"


@pytest.fixture(scope="module")
def vllm_calls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[list[Call]]]:
    """vLLM's calls for every case of every family, from one engine-environment process."""
    tokenizers = {name: engine_tokenizer(f, tmp_path_factory) for name, f in FAMILIES.items()}
    job = {
        name: {
            "tokenizer": tokenizers[name][0],
            "tokenizer_mode": tokenizers[name][1],
            "tool_parser": family.tool_parser,
            "reasoning_parser": family.reasoning_parser,
            "tools": family.tools,
            "harmony": family.harmony,
            "texts": [case.text for case in cases_of(family)],
        }
        for name, family in FAMILIES.items()
    }
    found: dict[str, list[list[list[str]]]] = run_in_engine(ENGINE, job, timeout_s=300)
    return {
        name: [[(name_, args) for name_, args in calls] for calls in per_case]
        for name, per_case in found.items()
    }


def titoflow_parse(
    family: str, case: Case, tools: list[dict[str, Any]], whole: bool
) -> ParsedOutput:
    parser = family_named(family).parser(
        ParserOptions("step", tools=tools, reasoning_open=case.reasoning_open)
    )
    for chunk in [case.text] if whole else list(case.text):
        parser.feed(chunk)
    return parser.finish()[1]


def same_call(found: Any, call: Call) -> bool:
    name, arguments = call
    return bool(
        found.name == name
        and json_object(arguments)
        and json.loads(found.arguments) == json.loads(arguments)
    )


def among(tito: ParsedOutput, vllm: Sequence[Call]) -> bool:
    """titoflow's calls are some of vLLM's, in order (the rest refused)."""
    rest = iter(vllm)
    return all(any(same_call(found, call) for call in rest) for found in tito.tool_calls)


def same_calls(tito: ParsedOutput, vllm: Sequence[Call]) -> bool:
    if [c.name for c in tito.tool_calls] != [name for name, _ in vllm]:
        return False
    return all(
        json_object(arguments) and json.loads(c.arguments) == json.loads(arguments)
        for c, (_, arguments) in zip(tito.tool_calls, vllm, strict=True)
    )


def compare(family: Family, case: Case, vllm: list[Call]) -> str:
    """ "agree", the declared difference's name, or why the case fails."""
    tito = titoflow_parse(family.name, case, family.tools, whole=True)
    streamed = titoflow_parse(family.name, case, family.tools, whole=False)
    if streamed != tito:
        return f"streamed {streamed} != whole {tito}"
    if tito.parse_error is None and any(m in tito.content for m in family.markers):
        return f"call-shaped content without parse_error: {tito}"
    if same_calls(tito, vllm):
        return "agree"
    refused = tito.parse_error is not None and among(tito, vllm)
    for difference in family.differences:
        if (refused or not difference.refusal) and difference.applies(case.text, vllm):
            return difference.name
    return f"titoflow {[(c.name, c.arguments) for c in tito.tool_calls]} " + (
        f"(parse_error {tito.parse_error!r}) != vLLM {vllm}"
    )


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_titoflow_extracts_the_calls_vllm_extracts(
    name: str, vllm_calls: dict[str, list[list[Call]]]
) -> None:
    family = FAMILIES[name]
    cases = cases_of(family)
    outcomes = {
        case.name: compare(family, case, calls)
        for case, calls in zip(cases, vllm_calls[name], strict=True)
    }
    declared = {d.name for d in family.differences}
    failures = {k: v for k, v in outcomes.items() if v != "agree" and v not in declared}
    texts = {case.name: case.text for case in cases}
    assert not failures, "\n".join(f"{k}: {texts[k]!r}\n  {v}" for k, v in failures.items())
    tally = {d: sum(v == d for v in outcomes.values()) for d in ("agree", *sorted(declared))}
    print(f"{name}: {len(cases)} cases, {tally}")
    assert tally["agree"] > len(cases) // 2, "most cases must agree outright"
    # Every declared difference is still seen (else it is stale and must go).
    assert all(tally[d] > 0 for d in declared), tally


def test_the_malformed_outputs_are_calls() -> None:
    """The outputs these models commonly write are calls in titoflow, without error, where
    vLLM extracts them too (the bugs of issue 37): no engine needed."""
    for module in MODULES:
        family = module.FAMILY
        for case in family.fixed:
            if case.name in module.READS:
                parsed = titoflow_parse(family.name, case, family.tools, whole=True)
                assert parsed.parse_error is None, (case.name, parsed)
                assert [c.name for c in parsed.tool_calls] == module.READS[case.name], case.name
