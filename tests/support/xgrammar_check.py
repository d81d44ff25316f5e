"""A family's forced-call grammar as vLLM compiles it: the structural tag titoflow sends, and
which texts xgrammar admits under it on the family's own tokenizer directory, the turn then
ended by the family's end token (run in the engine environment, one call for all cases)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cli.dev.tokenizers import tokenizer_dir
from tests.support.engine_env import run_in_engine
from titoflow.tito.families import grammar
from titoflow.tito.families.base import Family

_SCRIPT = r"""
import json, sys
import xgrammar as xgr
from transformers import AutoTokenizer
request = json.load(sys.stdin)
if request["mode"] == "auto":
    tok = AutoTokenizer.from_pretrained(request["tokenizer"])
else:
    from vllm.tokenizers import get_tokenizer
    tok = get_tokenizer(request["tokenizer"], tokenizer_mode=request["mode"])
end = tok.convert_tokens_to_ids(request["end"])
compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok)))
out = {}
for name, case in request["cases"].items():
    grammar = compiler.compile_structural_tag(case["tag"])
    matcher = xgr.GrammarMatcher(grammar, override_stop_tokens=[end])
    ids = tok.encode(case["text"], add_special_tokens=False)
    accepted = all(matcher.accept_token(t) for t in ids)
    out[name] = accepted and matcher.accept_token(end) and matcher.is_terminated()
print(json.dumps(out))
"""


def structural_tag(
    family: Family,
    tools: Sequence[dict[str, Any]],
    choice: grammar.ToolChoice,
    token_id: Callable[[str], int | None],
    **options: Any,
) -> str:
    """The structural tag titoflow sends for ``choice`` (a named choice names ``run``)."""
    name = "run" if choice == "named" else None
    found = grammar.tool_call_constraint(family, tools, choice, name, token_id, **options)
    assert found is not None
    return str(found["structured_outputs"]["structural_tag"])


def admitted(
    family: str, end: str, cases: Mapping[str, tuple[str, str]], tokenizer_mode: str = "auto"
) -> dict[str, bool]:
    """Per case name, whether the tag admits the text and then ``end`` ends it, on the tokenizer
    vLLM loads in ``tokenizer_mode`` (the mode it serves the family's checkpoints in)."""
    request = {
        "tokenizer": str(tokenizer_dir(family)),
        "mode": tokenizer_mode,
        "end": end,
        "cases": {n: {"tag": tag, "text": text} for n, (tag, text) in cases.items()},
    }
    result: dict[str, bool] = run_in_engine(_SCRIPT, request, timeout_s=300)
    return result
