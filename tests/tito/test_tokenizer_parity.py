"""Every family's tokenizer directory gives the ids vLLM's own loader gives for it.

titoflow sends the engine token ids, so a tokenizer that encodes a text differently from the
engine's is silent corruption: the model is fed what the client never wrote. The judge is vLLM's
``get_tokenizer`` (AutoTokenizer or its Mistral tokenizer, as vLLM resolves the directory), run
in the engine environment, against :func:`titoflow.tito.tokenizer.load_tokenizer` here, on a
corpus of hostile strings: CJK, emoji sequences, long whitespace runs, each family's own markers
and look-alikes of them, and lone surrogates as the API maps them. The DeepSeek directory names
``LlamaTokenizerFast`` over a byte-level ``tokenizer.json``, as the real checkpoints do.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ingress.json_body import parse_json
from titoflow.dev.tokenizers import SOURCES, tokenizer_dir
from titoflow.settings import Settings
from titoflow.tito.tokenizer import RemoteCodeRefused, TextEncoder, load_tokenizer

# Markers of the families (and a near miss of each: a space inside, a changed bar or case).
MARKERS = [
    "<|im_start|>user\nhi<|im_end|>",
    "<| im_start |>",
    "<|IM_START|>",
    "<｜User｜>hello<｜Assistant｜>",
    "<|User|>",
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}",
    "<|tool_calls_section_begin|> <|tool_call_begin|>functions.ls:0",
    "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>",
    "[INST] hi [/INST][TOOL_CALLS][{}]",
    "[ INST]",
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "<|start|>assistant<|channel|>analysis<|message|>x<|end|>",
    "<|user|>\n<think></think><|assistant|>",
    "<think>\nreasoning\n</think>\n\nanswer",
    "</think >",
]
TEXTS = [
    "Hello world",
    "你好世界，这是一个测试。中文标点！",
    "日本語のテキストとカタカナ、ひらがな",
    "한국어 문장입니다",
    "emoji 👩‍👩‍👧‍👦 🏳️‍🌈 👍🏽 🇫🇷 ✈︎",
    "tabs\t\tand\r\nCRLF\n\n\n\nnewlines",
    " " * 37 + "x" + " " * 5,
    "\n" * 20,
    "    def f(x):\n        return x  # indented\n",
    "ＦＵＬＬＷＩＤＴＨ and ﬁ ligature and e\u0301 combining",
    "\u200b zero width \u200d joiner \ufeff bom",
    '{"path": "/tmp", "n": 1.5e-3, "ok": true}',
    "a" * 300,
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝟙𝟚𝟛",
    *MARKERS,
]
# Lone surrogates, which clients do send (a UTF-16 string cut between a pair's halves), as the
# API's body parser hands them on.
SURROGATE_BODIES = [b'"cut \\ud83d here"', b'"\\udc00\\udc00 low"', b'"pair \\ud83d\\ude00 ok"']
CORPUS = [*TEXTS, *(parse_json(body, 64) for body in SURROGATE_BODIES)]

VLLM_ENCODE = """
import json, sys
from pathlib import Path
from tokenizers import Tokenizer
from vllm.tokenizers import get_tokenizer
request = json.load(sys.stdin)
out = {}
for family, path in request["dirs"].items():
    tok = get_tokenizer(path)
    shipped = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
    out[family] = {
        "class": type(tok).__name__,
        "ids": [list(tok.encode(t, add_special_tokens=False)) for t in request["texts"]],
        "file": [shipped.encode(t, add_special_tokens=False).ids for t in request["texts"]],
    }
print(json.dumps(out))
"""
# Where vLLM's loader is not the judge, and why: the ids are then the shipped tokenizer.json's,
# as the engine environment's `tokenizers` reads the file (what the checkpoint was trained on).
DECLARED = {
    # vLLM 0.32's loader, with the transformers 5.19 it runs on, builds the Llama class the
    # config names, which ignores the byte-level file (transformers 5.24, ours, loads the file
    # as written, as AutoTokenizer does from some 5.2x on): served so, a text prompt would reach
    # the model as ids it was never trained on. titoflow sends ids, so its are the file's.
    "deepseek_v3": "vLLM 0.32 (transformers 5.19) loads LlamaTokenizer over the byte-level file",
}


@pytest.fixture(scope="module")
def dirs() -> dict[str, Path]:
    return {family: tokenizer_dir(family) for family in SOURCES}


@pytest.fixture(scope="module")
def engine_ids(dirs: dict[str, Path]) -> dict[str, Any]:
    """Per family, what vLLM's loader and the shipped file encode each text to (one
    engine-environment process: importing vLLM takes seconds)."""
    python = Settings().engine_python
    assert python.exists(), f"no engine environment at {python}: run scripts/setup-engine.sh"
    request = {"dirs": {f: str(d) for f, d in dirs.items()}, "texts": CORPUS}
    result = subprocess.run(
        [str(python), "-c", VLLM_ENCODE],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("family", list(SOURCES))
def test_ids_equal_vllms_loader(family: str, dirs: dict[str, Path], engine_ids: Any) -> None:
    tokenizer = load_tokenizer(dirs[family])
    encode = TextEncoder(tokenizer)  # the hot path the ingress encodes with
    found = engine_ids[family]
    judge = found["file"] if family in DECLARED else found["ids"]
    differ = [
        (text, ours, their)
        for text, their in zip(CORPUS, judge, strict=True)
        if (ours := encode(text)) != their
        or list(tokenizer.encode(text, add_special_tokens=False)) != their
    ]
    assert not differ, (
        f"{family}: {len(differ)} of {len(CORPUS)} texts encode differently from "
        f"{'the shipped file' if family in DECLARED else found['class']} (first: {differ[0]})"
    )
    if family in DECLARED:  # the declaration stays true, or goes
        assert found["ids"] != found["file"], f"{family}: vLLM's loader agrees now: undeclare it"


def test_deepseek_directory_is_shaped_as_the_real_checkpoint(dirs: dict[str, Path]) -> None:
    """The case the parity must survive: the class the config names is not the one to load."""
    config = json.loads((dirs["deepseek_v3"] / "tokenizer_config.json").read_text())
    spec = json.loads((dirs["deepseek_v3"] / "tokenizer.json").read_text())
    assert config["tokenizer_class"] == "LlamaTokenizerFast"
    assert spec["pre_tokenizer"]["type"] == "Sequence" and "ByteLevel" in json.dumps(spec)
    assert load_tokenizer(dirs["deepseek_v3"]).encode("Hello world", add_special_tokens=False) == [
        19923,
        2058,
    ]


def test_a_tokenizer_that_is_code_runs_only_when_allowed(tmp_path: Path) -> None:
    """``auto_map`` (Kimi's tiktoken tokenizer ships so): refused in one line naming the setting,
    before anything of the directory is imported."""
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["tokenization_x.XTokenizer", None]}})
    )
    (tmp_path / "tokenization_x.py").write_text("raise SystemExit('imported')\n")
    with pytest.raises(RemoteCodeRefused, match="TITOFLOW_TRUST_REMOTE_CODE=1"):
        load_tokenizer(tmp_path)
