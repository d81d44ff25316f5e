"""Every model family end to end: a tiny random-weight model with the family's own tokenizer
and template (cli/dev/family_models.py) served by real vLLM CPU, titoflow's ingress and
worker on tansu, the OpenAI SDK running a linear tool loop (a named forced call, a required
streamed call, free text), and the witness holding the segment to what the engine sampled.

Each family's test takes its vocabulary's engine, started while the test before it ran
(tests/support/engines.py EngineLine) and stopped after the last test on it. Families whose
tokenizer files are another's, token for token (``SHARES_ENGINE``), run on that family's engine
with their own template: the engine compiles the forced calls' grammar against its tokenizer,
which is theirs too, and the ingress renders with the family's own directory. Qwen3, the default
policy's family, runs end to end in every other engine test of the suite: its sharers run on the
session's engine. A family's engine is brief (cli/dev/engine_process.py: no torch.compile
warm-up, its worker in the engine core process: most of a start) for its three requests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.dev.engine_process import start_vllm
from cli.dev.family_models import build_family_model
from cli.dev.tokenizers import SOURCES, tokenizer_dir
from tests.support.engines import EngineLine
from tests.support.sessions import session_on_stack
from tests.support.stacks import witnessed
from tests.support.tool_loop import tool_loop
from tests.support.topics import finalized_segments, recorded_steps
from tests.support.witness import Witness
from titoflow.settings import Settings
from titoflow.tito.families import FAMILIES

pytestmark = pytest.mark.engine

# family -> the family whose engine serves it: their tokenizer files are identical
# (the last test below holds each pair to it). Qwen3's is the session's.
SHARES_ENGINE = {
    "qwen3_coder": "qwen3",
    "gemma4": "gemma3",
    "deepseek_v32": "deepseek_v3",
    "magistral": "mistral_v11",
}
# Every family with a tokenizer recipe and a tool-call grammar (the loop forces its calls).
SERVED = sorted(
    (f.name for f in FAMILIES if f.name in SOURCES and f.grammar is not None and f.name != "qwen3"),
    key=lambda name: (SHARES_ENGINE.get(name, name), name),  # an engine's takers adjacent
)
# Bounded strings: a random model rarely closes an unbounded one (it runs to max_tokens).
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} a path",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "maxLength": 12}},
                "required": ["path"],
            },
        },
    }
    for name in ("ls", "cat")
]
# A forced call's budget: the grammar ends it, but a random model spells the grammar's text in
# fragments, and DeepSeek V3.2's DSML markers are text (its forced calls, sampled at random under
# the grammar, mostly run past 96 tokens).
FORCED_MAX_TOKENS = 160
# Three short requests: 256 MiB holds over 200k tokens of the tiny models' KV cache, and two
# family engines (one serving, one starting) sit beside the session's two.
FAMILY_KV_CACHE_BYTES = 256 * 1024 * 1024


@pytest.fixture(scope="module")
def family_engines(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineLine]:
    """The families' own engines, in the order this run's tests take them."""
    taken = [
        str(item.callspec.params["family_settings"])
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.module is request.module
        and "family_settings" in item.callspec.params
    ]
    line = EngineLine(
        [SHARES_ENGINE.get(f, f) for f in taken if SHARES_ENGINE.get(f) != "qwen3"],
        lambda family: start_vllm(
            Settings(
                model_path=build_family_model(family), engine_kv_cache_bytes=FAMILY_KV_CACHE_BYTES
            ),
            log_dir=tmp_path_factory.mktemp(f"vllm-{family}"),
            brief=True,
        ),
        ahead=1,
    )
    yield line
    line.close()


@pytest.fixture
def family_settings(
    request: pytest.FixtureRequest, settings: Settings, witness: Witness
) -> Iterator[Settings]:
    family = request.param
    engine = SHARES_ENGINE.get(family, family)
    if engine == "qwen3":
        url = request.getfixturevalue("engine_url")
        yield from witnessed(settings, url, tokenizer_dir(family), witness, request)
        return
    line = request.getfixturevalue("family_engines")
    url = line.take(engine)
    try:
        yield from witnessed(settings, url, tokenizer_dir(family), witness, request)
    finally:
        line.release(engine)


@pytest.mark.parametrize("family_settings", SERVED, indirect=True)
async def test_a_linear_tool_loop_is_one_exact_segment(
    family_settings: Settings, tmp_path: Path
) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "You are a shell agent."},
        {"role": "user", "content": "What is in /tmp? Ünïcode 🙂"},
    ]
    async with session_on_stack(family_settings, tmp_path, "family") as (url, session, client):
        seen = await tool_loop(client, messages, TOOLS, max_tokens=FORCED_MAX_TOKENS)
        segments = await finalized_segments(family_settings, url, session)

    steps = await recorded_steps(family_settings, session, 3)
    assert [s.prefix for s in steps] == ["rendered", "tito", "tito"]  # the chain was extended
    assert [s.parent_step_id for s in steps] == [None, steps[0].step_id, steps[1].step_id]
    assert isinstance(json.loads(seen[0]["calls"][0]["function"]["arguments"]), dict)
    names = [[c["function"]["name"] for c in turn["calls"]] for turn in seen]
    assert [
        [c["function"]["name"] for c in s.response_message.get("tool_calls", [])] for s in steps
    ] == names
    [segment] = [s for s in segments if s.session_id == session]
    assert [s.step_id for s in segment.steps] == [s.step_id for s in steps]


@pytest.mark.parametrize("family", sorted(SHARES_ENGINE))
def test_a_family_sharing_an_engine_has_its_tokenizer(family: str) -> None:
    """The engine's grammar and detokenizer are the serving family's: the sharer's tokenizer
    files must be the same, only its chat template differs."""
    own, serving = tokenizer_dir(family), tokenizer_dir(SHARES_ENGINE[family])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        mine, theirs = (
            json.loads((own / name).read_text()),
            json.loads((serving / name).read_text()),
        )
        mine.pop("chat_template", None)
        theirs.pop("chat_template", None)
        assert mine == theirs, name
