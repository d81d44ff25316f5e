"""The tiny model is built offline, torch-free and byte-for-byte reproducibly."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file
from transformers import AutoTokenizer

from titoflow.dev.model_build import STAMP_NAME, build_agent_policy, build_tiny_model, main


def _digests(model_dir: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(model_dir.iterdir())
        if p.is_file()
    }


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    first = build_tiny_model(tmp_path_factory.mktemp("first") / "model")
    second = build_tiny_model(tmp_path_factory.mktemp("second") / "model")
    return first, second


def test_rebuild_is_byte_identical(builds: tuple[Path, Path]) -> None:
    first, second = builds
    digests = _digests(first)
    assert set(digests) == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.json",
        "merges.txt",
        STAMP_NAME,
    }
    assert digests == _digests(second)


def test_build_never_needs_torch(builds: tuple[Path, Path]) -> None:
    assert "torch" not in sys.modules


def test_identical_build_is_skipped(builds: tuple[Path, Path]) -> None:
    first, _ = builds
    weights = first / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert build_tiny_model(first) == first
    assert weights.stat().st_mtime_ns == before


def test_other_seed_rebuilds_in_place(tmp_path: Path) -> None:
    out = tmp_path / "model"
    build_tiny_model(out, seed=0)
    seed0 = _digests(out)
    assert main(["--random", "--out", str(out), "--seed", "1"]) == 0
    seed1 = _digests(out)
    assert seed1["model.safetensors"] != seed0["model.safetensors"]
    assert seed1["tokenizer.json"] == seed0["tokenizer.json"]


def test_weights_are_tied_float32_qwen3(builds: tuple[Path, Path]) -> None:
    first, _ = builds
    config = json.loads((first / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["model_type"] == "qwen3"
    weights = load_file(str(first / "model.safetensors"))
    assert "lm_head.weight" not in weights  # tie_word_embeddings
    assert {w.dtype for w in weights.values()} == {np.dtype(np.float32)}
    embed = weights["model.embed_tokens.weight"]
    assert embed.shape == (config["vocab_size"], config["hidden_size"])
    assert 0.19 < float(embed.std()) < 0.21
    assert 15e6 < sum(w.size for w in weights.values()) < 25e6


def test_tokenizer_loads_and_vocab_fits(builds: tuple[Path, Path]) -> None:
    first, _ = builds
    tokenizer = AutoTokenizer.from_pretrained(str(first))
    config = json.loads((first / "config.json").read_text())
    generation = json.loads((first / "generation_config.json").read_text())
    assert len(tokenizer) <= config["vocab_size"]
    assert max(tokenizer.get_vocab().values()) < config["vocab_size"]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert generation["eos_token_id"] == im_end == config["eos_token_id"]


def test_chat_template_renders_tools(builds: tuple[Path, Path]) -> None:
    first, _ = builds
    tokenizer = AutoTokenizer.from_pretrained(str(first))
    tools: list[dict[str, Any] | Callable[..., Any]] = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Weather in Paris?"}],
        tools=tools,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert isinstance(text, str)
    assert "<tools>" in text and '"name": "get_weather"' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_moe_sibling_is_reproducible_qwen3_moe(tmp_path: Path) -> None:
    first = build_tiny_model(tmp_path / "a", moe=True)
    assert main(["--moe", "--out", str(tmp_path / "b")]) == 0
    assert _digests(first) == _digests(tmp_path / "b")
    config = json.loads((first / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert (config["num_experts"], config["num_experts_per_tok"]) == (8, 2)
    weights = load_file(str(first / "model.safetensors"))
    layers, experts = config["num_hidden_layers"], config["num_experts"]
    assert weights["model.layers.0.mlp.gate.weight"].shape == (experts, config["hidden_size"])
    assert sum(".experts." in name for name in weights) == layers * experts * 3
    assert not any("mlp.gate_proj" in name for name in weights)  # no dense MLP left
    dense = _digests(build_tiny_model(tmp_path / "dense"))
    assert dense["model.safetensors"] != _digests(first)["model.safetensors"]


def test_agent_policy_is_reproducible_qwen3_with_a_32k_context(tmp_path: Path) -> None:
    first = build_agent_policy(tmp_path / "a")
    assert main(["--out", str(tmp_path / "b")]) == 0  # the default build is the agentic policy
    assert _digests(first) == _digests(tmp_path / "b")
    config = json.loads((first / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    assert config["max_position_embeddings"] >= 32768
    weights = load_file(str(first / "model.safetensors"))
    assert "lm_head.weight" not in weights
    assert {w.dtype for w in weights.values()} == {np.dtype(np.float32)}
    assert (
        _digests(first)["tokenizer.json"]
        == _digests(build_tiny_model(tmp_path / "r"))["tokenizer.json"]
    )
