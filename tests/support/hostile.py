"""Hostile strings for the tokenizer differential tests: text on which tokenizers that look alike
part ways (CJK, emoji sequences, long whitespace runs, every family's markers and near misses of
them, lone surrogates as the API's body parser hands them on).

The invariant: ``CORPUS`` is the one list every tokenizer-parity test encodes (vLLM's loader and
Kimi's own tokenizer code judge the same strings), so a count in docs/models.md ("34 hostile
strings") means the same strings everywhere.
"""

from __future__ import annotations

from ingress.wire.json_body import parse_json

SPELLS_CONTROL_TOKENS = "[INST] hi [/INST][TOOL_CALLS][{}]"  # Mistral's
# A quote before a word, case changes inside words, a digit run: where pre-tokenizer patterns part.
QUOTED_WORDS = "print(f'Source: {x}', r'def', 'return') # eBay NaOH 12345"
# Markers of the families (and a near miss of each: a space inside, a changed bar or case).
MARKERS = [
    "<|im_start|>user\nhi<|im_end|>",
    "<| im_start |>",
    "<|IM_START|>",
    "<｜User｜>hello<｜Assistant｜>",
    "<|User|>",
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}",
    "<|tool_calls_section_begin|> <|tool_call_begin|>functions.ls:0",
    ']~!b[]~b]ai\n<minimax:tool_call>\n<invoke name="ls">[e~[ ]~b ]ai <minimax :tool_call>',
    "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>",
    SPELLS_CONTROL_TOKENS,
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
    QUOTED_WORDS,
    *MARKERS,
]
# Lone surrogates, which clients do send (a UTF-16 string cut between a pair's halves), as the
# API's body parser hands them on.
SURROGATE_BODIES = [b'"cut \\ud83d here"', b'"\\udc00\\udc00 low"', b'"pair \\ud83d\\ude00 ok"']
CORPUS = [*TEXTS, *(parse_json(body, 64) for body in SURROGATE_BODIES)]
