"""Every family's tokenizer directory gives the ids vLLM's own loader gives for it.

titoflow sends the engine token ids, so a tokenizer that encodes a text differently from the
engine's is silent corruption: the model is fed what the client never wrote. The judge is vLLM's
``get_tokenizer`` (AutoTokenizer or its Mistral tokenizer, as vLLM resolves the directory), run
in the engine environment, against :func:`titoflow.tito.tokenizer.load_tokenizer` here, on a
corpus of hostile strings: CJK, emoji sequences, long whitespace runs, each family's own markers
and look-alikes of them, and lone surrogates as the API maps them. The DeepSeek directory names
``LlamaTokenizerFast`` over a byte-level ``tokenizer.json``, as the real checkpoints do.

Mistral's checkpoints ship ``tekken.json``, which vLLM serves in ``tokenizer_mode=mistral``
(mistral-common's tokenizer and request encoder): two directories shaped so, with the family's
Hugging Face files beside mistral-common's tekken file (one with the generic tiktoken pattern
transformers warns of as the "incorrect regex pattern"), are held to that mode, text by text and
for rendered conversations.
"""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from transformers.convert_slow_tokenizer import TikTokenConverter

from cli.dev.tokenizers import SOURCES, tokenizer_dir
from cli.dev.tokenizers import magistral_v13 as magistral_v13_recipe
from cli.dev.tokenizers import mistral as mistral_recipe
from cli.dev.tokenizers import mistral_v11 as mistral_v11_recipe
from tests.support.engine_env import run_in_engine
from tests.support.hostile import CORPUS, QUOTED_WORDS, SPELLS_CONTROL_TOKENS
from tests.support.mistral_family import CONVERSATIONS, TOOLS
from titoflow.tito.messages import Message
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import TEKKEN, RemoteCodeRefused, TextEncoder, load_tokenizer

VLLM_ENCODE = """
import json, logging, sys
from pathlib import Path
from tokenizers import Tokenizer
from vllm.tokenizers import get_tokenizer
request = json.load(sys.stdin)
out = {}
for family, path in request["dirs"].items():
    tok = get_tokenizer(path, tokenizer_mode=request["modes"].get(family, "auto"))
    shipped = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
    out[family] = {
        "class": type(tok).__name__,
        "ids": [list(tok.encode(t, add_special_tokens=False)) for t in request["texts"]],
        "file": [shipped.encode(t, add_special_tokens=False).ids for t in request["texts"]],
    }
warnings = []
handler = logging.Handler()
handler.emit = lambda record: warnings.append(record.getMessage())
logging.getLogger("transformers").addHandler(handler)
logging.getLogger("transformers").setLevel(logging.WARNING)  # titoflow's env says error
for name, path in request["mistral"]["dirs"].items():
    served = get_tokenizer(path, tokenizer_mode="mistral")
    warnings.clear()
    hf = get_tokenizer(path, tokenizer_mode="hf")
    out[name] = {
        "class": type(served).__name__,
        "ids": [served.encode(t, add_special_tokens=False) for t in request["texts"]],
        "hf_ids": [list(hf.encode(t, add_special_tokens=False)) for t in request["texts"]],
        "hf_warned": any("incorrect regex pattern" in w for w in warnings),
        "prompts": [
            served.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True)
            for messages, tools in request["mistral"]["conversations"]
        ],
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
# The tokenizer mode vLLM picks for a family's checkpoints where it is not "auto": DeepSeek-V3.2's
# architecture (DeepseekV32ForCausalLM) selects "deepseek_v32", which reads tokenizer.json as
# written (the same file as deepseek_v3's, which the "auto" mode misreads: see DECLARED);
# DeepSeek-V4's (DeepseekV4ForCausalLM) selects "deepseek_v4", which reads it so too.
MODES = {"deepseek_v32": "deepseek_v32", "deepseek_v4": "deepseek_v4"}


# The pre-tokenizer pattern transformers' tiktoken converter falls back on (digits in threes, no
# split at a case change), where the tekken one is tekken.json's own.
GENERIC_PATTERN = inspect.signature(TikTokenConverter).parameters["pattern"].default
# Rendered for the Mistral checkpoints: each text as a user's message, and the family's own
# conversations that end where a prompt is served (a user's message or a tool result).
MISTRAL_PROMPTS: list[tuple[list[Message], list[dict[str, Any]]]] = [
    *(([Message(role="user", content=text)], []) for text in CORPUS),
    *(
        (messages, tools)
        for messages in CONVERSATIONS.values()
        if messages[-1].role != "assistant"
        for tools in (TOOLS, [])
    ),
]


@pytest.fixture(scope="module")
def dirs() -> dict[str, Path]:
    return {family: tokenizer_dir(family) for family in SOURCES}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Mistral directories shaped as the real checkpoints: the Hugging Face files, the v7 tekken
    file beside them, a ``config.json`` of ``model_type`` mistral without the transformers
    version (so transformers warns of the regex, as for the tiny model the engine serves)."""
    tekken = json.loads(mistral_recipe.tekken_file().read_text())
    tekken["config"]["version"] = "v7"  # as Small 3.1's; the v7 control tokens are the default's
    made = {}
    for name, pattern in [
        ("mistral_checkpoint", None),
        ("mistral_generic_regex", GENERIC_PATTERN),
    ]:
        path = tmp_path_factory.mktemp(name)
        shutil.copytree(tokenizer_dir("mistral"), path, dirs_exist_ok=True)
        (path / TEKKEN).write_text(json.dumps(tekken))
        (path / "config.json").write_text(
            json.dumps({"architectures": ["MistralForCausalLM"], "model_type": "mistral"})
        )
        if pattern is not None:
            spec = json.loads((path / "tokenizer.json").read_text())
            spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern
            (path / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
        made[name] = path
    # The v11 family's directory beside its v11 tekken file (Small 3.2's shape), and the v13
    # one's beside its v13 file (Magistral Small 2507's).
    for family, tekken_of in [
        ("mistral_v11", mistral_v11_recipe.tekken_v11),
        ("magistral_v13", magistral_v13_recipe.tekken_v13),
    ]:
        path = tmp_path_factory.mktemp(f"{family}_checkpoint")
        shutil.copytree(tokenizer_dir(family), path, dirs_exist_ok=True)
        (path / TEKKEN).write_text(json.dumps(tekken_of(), ensure_ascii=False))
        (path / "config.json").write_text((made["mistral_checkpoint"] / "config.json").read_text())
        made[f"{family}_checkpoint"] = path
    return made


@pytest.fixture(scope="module")
def engine_ids(dirs: dict[str, Path], checkpoints: dict[str, Path]) -> dict[str, Any]:
    """Per family, what vLLM's loader and the shipped file encode each text to; per Mistral
    checkpoint, what vLLM's Mistral and Hugging Face modes encode, and the Mistral mode's
    prompts (one engine-environment process: importing vLLM takes seconds)."""
    conversations = [
        ([m.template_dict(arguments_text=True) for m in messages], tools)
        for messages, tools in MISTRAL_PROMPTS
    ]
    request = {
        "dirs": {f: str(d) for f, d in dirs.items()},
        "modes": MODES,
        "texts": CORPUS,
        "mistral": {
            "dirs": {name: str(path) for name, path in checkpoints.items()},
            "conversations": conversations,
        },
    }
    # Every family's directory and Mistral checkpoint in one process: on a machine shared with
    # the engine tests it can outlast run_in_engine's default bound; pytest's own is 900 s.
    found: dict[str, Any] = run_in_engine(VLLM_ENCODE, request, timeout_s=870)
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


def spells_a_control_token(tokenizer: Any, text: str) -> bool:
    return any(token in text for token in tokenizer.get_added_vocab())


@pytest.mark.parametrize(
    "checkpoint",
    [
        "mistral_checkpoint",
        "mistral_generic_regex",
        "mistral_v11_checkpoint",
        "magistral_v13_checkpoint",
    ],
)
def test_mistral_ids_equal_vllms_mistral_mode(
    checkpoint: str, checkpoints: dict[str, Path], engine_ids: Any
) -> None:
    """Every text but those that spell a control token (declared: mistral-common encodes such
    text as plain text, titoflow, as vLLM's HF mode, the token it spells, since it encodes the
    rendered template as one text)."""
    tokenizer = load_tokenizer(checkpoints[checkpoint])
    encode = TextEncoder(tokenizer)
    found = engine_ids[checkpoint]
    assert found["class"] == "MistralTokenizer"
    differ = [
        text
        for text, their in zip(CORPUS, found["ids"], strict=True)
        if encode(text) != their or tokenizer.encode(text, add_special_tokens=False) != their
    ]
    spelled = [text for text in CORPUS if spells_a_control_token(tokenizer, text)]
    assert differ == spelled, f"{len(differ)} of {len(CORPUS)} differ: {differ}"
    assert spelled == [SPELLS_CONTROL_TOKENS]


def test_the_generic_regex_is_what_vllms_hf_mode_serves(engine_ids: Any) -> None:
    """The regex transformers warns of changes ids, and vLLM's Hugging Face mode serves the file
    as written; with tekken's own pattern in it (the family's directory) the two modes differ
    only on the text that spells control tokens. transformers warns of both files alike: it
    judges by ``config.json`` (a Mistral model type, no transformers version), not the file."""
    generic, tekken = engine_ids["mistral_generic_regex"], engine_ids["mistral_checkpoint"]
    assert generic["hf_warned"] and tekken["hf_warned"]

    def modes_differ(found: dict[str, Any]) -> list[str]:
        pairs = zip(CORPUS, found["hf_ids"], found["ids"], strict=True)
        return [text for text, hf, mistral in pairs if hf != mistral]

    assert modes_differ(tekken) == [SPELLS_CONTROL_TOKENS]
    # Rare on real text (the tekken merges mostly rebuild the same tokens: 3 of 96,016 lines of
    # Python sources): the generic pattern's contractions take ``'d`` of ``'def``.
    assert modes_differ(generic) == [QUOTED_WORDS, SPELLS_CONTROL_TOKENS]


@pytest.mark.parametrize(
    "checkpoint", ["mistral_checkpoint", "mistral_v11_checkpoint", "magistral_v13_checkpoint"]
)
def test_mistral_prompts_equal_vllms_mistral_mode(
    checkpoint: str, checkpoints: dict[str, Path], engine_ids: Any
) -> None:
    """Rendered and encoded by titoflow, as mistral-common encodes the request in vLLM's
    Mistral mode (v7, v11 for the v11 family, v13 for Magistral's), but for the messages that
    spell a control token (declared, as above)."""
    tokenizer = load_tokenizer(checkpoints[checkpoint])
    renderer = ChatRenderer(tokenizer)
    differ = [
        messages
        for (messages, tools), their in zip(
            MISTRAL_PROMPTS, engine_ids[checkpoint]["prompts"], strict=True
        )
        if renderer.full_prompt(messages, tools, {}) != their
    ]
    spelled = [
        messages
        for messages, _ in MISTRAL_PROMPTS
        if any(spells_a_control_token(tokenizer, m.content) for m in messages)
    ]
    assert differ == spelled, f"{len(differ)} of {len(MISTRAL_PROMPTS)} differ: {differ}"
    assert len(spelled) == 1


def test_a_directory_with_tekken_json_alone_is_refused_naming_the_fix(tmp_path: Path) -> None:
    """As Devstral's and Magistral's repositories ship: no Hugging Face files, no template."""
    shutil.copy(mistral_recipe.tekken_file(), tmp_path / TEKKEN)
    with pytest.raises(FileNotFoundError, match=r"tekken\.json but no tokenizer_config\.json"):
        load_tokenizer(tmp_path)


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
