"""Stand-in vocabularies: a family whose own tokenizer is in no package or public repository is
given another family's vocabulary with its own markers added, under its chat template.

Invariant: the written directory is a function of the base directory, the tokens added and the
template alone; every marker added is one token, and the markers a parser reads stay in the
decoded text when special tokens are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from tokenizers import AddedToken

from cli.dev.tokenizers import template_path
from titoflow.tito.tokenizer import load_tokenizer


def write_stand_in(
    dest: Path,
    base: Path,
    template: str,
    specials: Mapping[str, str | Sequence[str]] | None = None,
    markers: Sequence[str] = (),
) -> None:
    """``base``'s tokenizer with ``specials`` added as special tokens (``add_special_tokens``'
    mapping; the extra special tokens it has are kept), ``markers`` as added tokens that are
    not special, and ``template`` as its chat template, saved in ``dest``."""
    tokenizer = load_tokenizer(base)
    if specials:
        tokenizer.add_special_tokens(dict(specials), replace_extra_special_tokens=False)
    if markers:
        tokenizer.add_tokens([AddedToken(m, special=False, normalized=False) for m in markers])
    tokenizer.chat_template = template_path(template).read_text()
    tokenizer.save_pretrained(dest)
