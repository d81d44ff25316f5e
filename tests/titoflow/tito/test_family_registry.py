"""The family registry: every family's template is detected as that family and no other, a
template of no known family and an unknown setting are refused with one line naming the known
families, and the services say so before they start."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli.dev.tokenizers import SOURCES, tokenizer_dir
from tests.support.families import family_tokenizer
from titoflow.settings import PROJECT_ROOT, Settings
from titoflow.tito.families import (
    AUTO,
    FAMILIES,
    NAMES,
    detect_family,
    family_named,
    grammar,
    resolve_family,
)
from titoflow.tito.render import ChatRenderer, template_source


def test_the_family_list_is_written_once() -> None:
    assert len(NAMES) == len(set(NAMES)) == len(FAMILIES)
    assert set(SOURCES) == set(NAMES)  # every family has a tokenizer recipe to be proven with


@pytest.mark.parametrize("name", NAMES)
def test_each_template_is_detected_as_its_family_only(name: str) -> None:
    template = template_source(family_tokenizer(name))
    assert detect_family(template).name == name
    others = [f.name for f in FAMILIES if f.name != name and f.detect(template or "")]
    # A refinement may also match its base families (Qwen3-Coder's template is Qwen3's kind,
    # Qwen3.5's Qwen3-Coder's, Magistral's Mistral v11's); the registry order puts the
    # refinement first.
    assert others in ([], ["qwen3"], ["qwen3_coder", "qwen3"], ["mistral_v11"])


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]


@pytest.mark.parametrize("name", [f.name for f in FAMILIES if f.grammar is not None])
def test_no_grammar_asks_for_a_stop_token(name: str) -> None:
    """xgrammar admits none of a request's stop tokens until the grammar is complete: a grammar
    that named one would leave nothing to sample (vLLM then samples token 0 and its engine core
    dies). Every marker a grammar names by id is checked against the stop tokens the renderer
    sends, with and without a reasoning block."""
    renderer = ChatRenderer(family_tokenizer(name))
    family = renderer.family
    for reasoning in (False, True) if family.reasoning_tags else (False,):
        found = grammar.tool_call_constraint(
            family, TOOLS, "required", None, renderer.token_id, parallel=True, reasoning=reasoning
        )
        assert found is not None
        named = re.findall(r'"token":(\d+)', found["structured_outputs"]["structural_tag"])
        assert not set(renderer.stop_token_ids) & {int(t) for t in named}, reasoning


def test_an_unknown_template_or_setting_names_the_known_families() -> None:
    with pytest.raises(ValueError, match=", ".join(NAMES)):
        detect_family("{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(ValueError, match="known: " + ", ".join(NAMES)):
        resolve_family("nonesuch", None)
    assert resolve_family(AUTO, template_source(family_tokenizer("llama3"))).name == "llama3"
    with pytest.raises(ValueError, match="unknown model family 'nonesuch'"):
        Settings(model_family="nonesuch")


def _ingress(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "titoflow"), "ingress"],
        env={**os.environ, **env},
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_service_refuses_an_unknown_family_in_one_line(tmp_path: Path) -> None:
    bad = _ingress({"TITOFLOW_MODEL_FAMILY": "nonesuch"})
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    [line] = bad.stderr.strip().splitlines()
    assert line.startswith("titoflow ingress: TITOFLOW_MODEL_FAMILY: ") and "qwen3" in line

    config = {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_bytes(
        (tokenizer_dir("qwen3") / "tokenizer.json").read_bytes()
    )
    unknown = _ingress({"TITOFLOW_MODEL_PATH": str(tmp_path)})
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    [line] = unknown.stderr.strip().splitlines()
    assert "no known model family" in line and "TITOFLOW_MODEL_FAMILY" in line


def divergence_rows(doc: str) -> list[tuple[set[str], set[str]]]:
    """docs/models.md's divergence table: each row's classes and the families it names."""
    section = doc.split("## Divergences", 1)[1]
    lines = section.split("| class | families |", 1)[1].splitlines()[2:]
    rows = []
    for line in itertools.takewhile(lambda line: line.startswith("|"), lines):
        classes, families = re.split(r"(?<!\\)\|", line)[1:3]
        rows.append(
            (
                set(re.findall(r"`(\w+)`", classes)),
                set(re.findall(r"\b\w+\b", families)) & set(NAMES),
            )
        )
    return rows


def test_the_divergence_table_is_the_registry_s() -> None:
    rows = divergence_rows((PROJECT_ROOT / "docs" / "models.md").read_text())
    tabled = {(name, kind) for kinds, names in rows for kind in kinds for name in names}
    for family in FAMILIES:
        for kind in family.divergences:
            assert (family.name, kind) in tabled, f"{family.name}'s {kind} is not in the table"
    for kinds, names in rows:
        for name in names:  # a row names only families that declare one of its classes
            assert kinds & set(family_named(name).divergences), (sorted(kinds), name)
