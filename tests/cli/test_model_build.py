"""The tiny model is built offline, torch-free and byte-for-byte reproducibly, and only ever
into a directory titoflow made: a user's model is served as it is, anything else refused; `up`
builds only at its default path, and serves any path it is given as it is or refuses it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file
from transformers import AutoTokenizer

from cli.dev import model_build, models
from cli.dev.model_build import STAMP_NAME, build_tiny_model
from cli.dev.models import build_agent_policy, main, model_for_up
from cli.dev.vl_policy import IMAGE_PAD_ID, TEMPLATE_SHA256, VISION_START_ID, build_vl_policy
from titoflow.settings import PROJECT_ROOT, SettingError, Settings


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


def test_build_never_needs_torch(tmp_path: Path) -> None:
    """In a process of its own: torch is installed here (the trainer's extra) and this test
    process imports it elsewhere; the build must not."""
    probe = (
        "import sys; from pathlib import Path\n"
        "from cli.dev.model_build import build_tiny_model\n"
        f"build_tiny_model(Path({str(tmp_path / 'model')!r}))\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


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


def test_vl_policy_is_reproducible_qwen3_vl_with_the_random_models_decoder(
    tmp_path: Path, builds: tuple[Path, Path]
) -> None:
    first = build_vl_policy(tmp_path / "a")
    # The CLI's build, in a process of its own: this one may have torch from transformers.
    script = (
        "import sys; from cli.dev.models import main; "
        f"code = main(['--vl', '--out', {str(tmp_path / 'b')!r}]); "
        "sys.exit(code or ('torch' in sys.modules and 'torch imported'))"
    )
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    built = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert built.returncode == 0, built.stderr
    digests = _digests(first)
    assert digests == _digests(tmp_path / "b")
    assert {"preprocessor_config.json", "video_preprocessor_config.json"} <= set(digests)
    config = json.loads((first / "config.json").read_text())
    assert config["architectures"] == ["Qwen3VLForConditionalGeneration"]
    text = config["text_config"]
    assert sum(text["rope_parameters"]["mrope_section"]) == text["head_dim"] // 2
    weights = load_file(str(first / "model.safetensors"))
    random_model = load_file(str(builds[0] / "model.safetensors"))
    assert {k for k in weights if not k.startswith("model.visual.")} == {
        "model.language_model." + k.removeprefix("model.") for k in random_model
    }
    embed = weights["model.language_model.embed_tokens.weight"]
    assert np.array_equal(embed, random_model["model.embed_tokens.weight"])
    assert weights["model.visual.merger.linear_fc2.weight"].shape[0] == text["hidden_size"]
    assert {w.dtype for w in weights.values()} == {np.dtype(np.float32)}
    processor = json.loads((first / "preprocessor_config.json").read_text())
    assert (processor["patch_size"], processor["merge_size"]) == (16, 2)
    assert processor["size"] == {"shortest_edge": 32 * 32, "longest_edge": 256 * 256}


def test_vl_template_is_qwen3_vls_and_renders_one_placeholder_per_image(tmp_path: Path) -> None:
    model = build_vl_policy(tmp_path / "vl")
    template = (model / "chat_template.jinja").read_bytes()
    assert hashlib.sha256(template).hexdigest() == TEMPLATE_SHA256
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    assert tokenizer.chat_template == template.decode()  # the renderer reads the same template
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages: Any = [
        {"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "screenshot", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "content": [{"type": "text", "text": "shot:"}, {"type": "image"}]},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert isinstance(text, str)
    placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
    assert text.startswith(f"<|im_start|>user\n{placeholder}What is this?<|im_end|>\n")
    assert f"<tool_response>\nshot:{placeholder}\n</tool_response><|im_end|>\n" in text
    ids = tokenizer.encode(text)
    assert ids.count(IMAGE_PAD_ID) == 2
    assert tokenizer.convert_tokens_to_ids(["<|vision_start|>", "<|image_pad|>"]) == [
        VISION_START_ID,
        IMAGE_PAD_ID,
    ]


def _snapshot(directory: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``directory`` and beside it: its sha256 and mtime."""
    return {
        str(p.relative_to(directory.parent)): (
            hashlib.sha256(p.read_bytes()).hexdigest(),
            p.stat().st_mtime_ns,
        )
        for p in sorted(directory.parent.rglob("*"))
        if p.is_file()
    }


def served_by_up(model_path: Path) -> Path:
    """The model `titoflow up` serves from ``model_path`` (built there only at its default)."""
    return model_for_up(Settings(model_path=model_path))


@pytest.fixture
def users_model(tmp_path: Path) -> Path:
    """Someone's own model directory: their config, weights and tokenizer, no stamp of ours."""
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["MyForCausalLM"]}\n')
    (model / "model.safetensors").write_bytes(os.urandom(4096))
    (model / "tokenizer.json").write_text('{"mine": true}\n')
    (model / "tokenizer_config.json").write_text('{"chat_template": "mine"}\n')
    return model


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT), **env},
        timeout=120,
    )


def test_a_users_model_is_served_as_it_is(
    users_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every build path (the one `titoflow up` takes, and build-model's), by absolute and by
    relative path, leaves every byte and mtime alone and writes nothing beside it."""
    before = _snapshot(users_model)
    assert served_by_up(users_model) == users_model  # what `titoflow up` serves
    assert build_agent_policy(users_model) == users_model
    assert build_tiny_model(users_model, moe=True) == users_model
    monkeypatch.chdir(users_model.parent)
    assert served_by_up(Path("my-model")) == users_model
    assert served_by_up(Path("./my-model/../my-model")) == users_model
    assert main(["--out", "my-model"]) == 0
    assert main(["--random", "--out", str(users_model)]) == 0
    assert _snapshot(users_model) == before
    built = _cli("build-model", TITOFLOW_MODEL_PATH=str(users_model))
    assert built.returncode == 0 and built.stdout.strip() == str(users_model), built
    assert "left as it is" in built.stderr
    assert _snapshot(users_model) == before


def test_a_directory_neither_a_model_nor_ours_is_refused_in_one_line(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "config.json").write_text("{}\n")  # a config alone is not a model
    (notes / "todo.txt").write_text("keep me\n")
    before = _snapshot(notes)
    with pytest.raises(SettingError) as refused:
        served_by_up(notes)
    assert refused.value.setting == "TITOFLOW_MODEL_PATH"
    assert "tokenizer_config.json" in refused.value.message and "weights" in refused.value.message
    for args, env, named in (
        (["--out", str(notes)], {}, "--out"),
        ([], {"TITOFLOW_MODEL_PATH": str(notes)}, "TITOFLOW_MODEL_PATH"),
    ):
        result = _cli("build-model", *args, **env)
        assert result.returncode == 2, result
        assert result.stdout == "" and "Traceback" not in result.stderr, result
        line = result.stderr.strip()
        assert "\n" not in line and line.startswith(f"titoflow build-model: {named}: "), line
        assert str(notes) in line and "point it at a model directory" in line, line
    assert _snapshot(notes) == before


def test_a_relative_path_names_the_same_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, builds: tuple[Path, Path]
) -> None:
    """`.models/tiny-qwen3` named relatively is the random model's directory, served as it is;
    `up` given an empty one refuses it and `build-model --random` builds into it."""
    random_dir = tmp_path / ".models" / "tiny-qwen3"
    random_dir.mkdir(parents=True)  # empty: nothing of anyone's to lose
    monkeypatch.setattr(model_build, "RANDOM_MODEL_DIR", random_dir)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SettingError, match="holds no model"):
        served_by_up(Path(".models/tiny-qwen3"))
    assert not any(random_dir.iterdir())
    assert main(["--random"]) == 0
    assert _digests(random_dir) == _digests(builds[0])
    before = _snapshot(random_dir)
    assert served_by_up(Path(".models/tiny-qwen3")) == random_dir
    assert served_by_up(builds[0]) == builds[0]  # the random model, not rebuilt
    assert _snapshot(random_dir) == before
    assert json.loads((builds[0] / STAMP_NAME).read_text())["kind"] == "random"


@pytest.mark.parametrize(
    "stamp",
    [
        {"recipe": "a family's", "family": "llama3"},  # .models/families/<family>: no kind
        {"recipe": "an older recipe's", "kind": "random", "seed": 0},
        {"recipe": "an older recipe's", "kind": "agent", "seed": 0},
    ],
)
def test_up_serves_a_model_another_recipe_built_as_it_is(
    tmp_path: Path, builds: tuple[Path, Path], stamp: dict[str, Any]
) -> None:
    """A directory titoflow built with another recipe (a family's tiny model, a stale build)
    is the model asked for: `up` serves it untouched, never rebuilt as the agentic policy."""
    given = tmp_path / "families" / "llama3"
    shutil.copytree(builds[0], given)
    (given / STAMP_NAME).write_text(json.dumps(stamp) + "\n")
    before = _snapshot(given)
    assert served_by_up(given) == given
    assert _snapshot(given) == before


def test_up_refuses_a_missing_or_empty_given_path_in_one_line(tmp_path: Path) -> None:
    """A path given to `up` that holds no model is refused with the fix, nothing written: not
    the vision policy's, nor the random model's directory, nor a new one."""
    empty = tmp_path / "tiny-qwen3-vl"
    empty.mkdir()
    for given, lacks in ((tmp_path / "new", "does not exist"), (empty, "holds no model")):
        with pytest.raises(SettingError) as refused:
            served_by_up(given)
        assert refused.value.setting == "TITOFLOW_MODEL_PATH"
        message = refused.value.message
        assert "\n" not in message and message.startswith(f"{given} {lacks}"), message
        assert f"titoflow build-model --out {given}" in message, message
    assert not (tmp_path / "new").exists() and not any(empty.iterdir())
    result = _cli("up", "--run-dir", str(tmp_path / "run"), TITOFLOW_MODEL_PATH=str(empty))
    assert result.returncode == 2, result
    line = result.stderr.strip()
    assert "\n" not in line, line
    assert line.startswith(f"titoflow up: TITOFLOW_MODEL_PATH: {empty} holds no model"), line
    assert not any(empty.iterdir())


def test_up_builds_the_agentic_policy_at_its_default_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = tmp_path / "tiny-qwen3-agent"
    monkeypatch.setattr(models, "DEFAULT_MODEL_DIR", default)
    assert served_by_up(default) == default
    assert json.loads((default / STAMP_NAME).read_text())["kind"] == "agent"
