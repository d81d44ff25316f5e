"""The published definitions the trainer-format converters (titoflow/client/formats) are tested
against, extracted from each framework's source at a pinned commit into
``tests/support/trainer_formats.json`` (committed: the tests need no framework and no network).

Rebuild after moving a pin, from git clones of the five repositories::

    python -m tests.support.trainer_formats verl=PATH slime=PATH miles=PATH openrlhf=PATH
    tinker=PATH

Extracted mechanically (Python's ast on ``git show COMMIT:PATH``): the fields of slime's, miles'
and OpenRLHF's dataclasses (annotation, trailing comment, OpenRLHF's tensor role), the members
of ``Sample.Status``, Tinker's ``_KEY_TO_TYPE`` and its text chunk's type, and the keys of the
batch verl's agent loop builds (with their shape comments). What the sources say only in code
(dtypes a call returns, the action shift, length checks, which loss takes which inputs) is in
``READ`` below, each with the line it follows from.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("trainer_formats.json")

PINS = {
    "verl": ("volcengine/verl", "b178a3cd56f58b2d502255daba591e92833930a7"),
    "slime": ("THUDM/slime", "624b824a898ab0ec1fcb4d373004c7f3852bf515"),
    "miles": ("radixark/miles", "31f1ca961a94cb860cec3b2dea34ec332bfa8f76"),
    "openrlhf": ("OpenRLHF/OpenRLHF", "3c3be6234e0cb353e76bb8019947db9dfe99fca7"),
    "tinker": ("thinking-machines-lab/tinker", "d595dc2ba62a1494aa0f452fe1d0dbb7b321b870"),
}
VERL_AGENT_LOOP = "verl/experimental/agent_loop/agent_loop.py"
SAMPLE = {"slime": "slime/utils/types.py", "miles": "miles/utils/types.py"}
EXPERIENCE = "openrlhf/trainer/ppo_utils/experience.py"
TINKER = {
    "datum": "src/tinker/types/datum.py",
    "chunk": "src/tinker/types/encoded_text_chunk.py",
    "model_input": "src/tinker/types/_pydantic_types/model_input.py",
}

READ: dict[str, dict[str, Any]] = {
    "verl": {
        "dtypes": {
            "prompts": "int64",
            "responses": "int64",
            "response_mask": "int64",
            "input_ids": "int64",
            "attention_mask": "int64",
            "position_ids": "int64",
            "rollout_log_probs": "float32",
            "rm_scores": "float32",
        },
        "why": "agent_loop.py _postprocess/_agent_loop_postprocess: ids and masks from "
        "tokenizer.pad(return_tensors='pt') (int64), position_ids from "
        "verl/utils/model.py compute_position_id_with_mask (cumsum of the int64 mask, clipped "
        "at 0), rollout_log_probs torch.tensor(list of floats) (float32), rm_scores "
        "torch.zeros_like(response_mask, dtype=torch.float32) with the score at index "
        "attention_mask[:, prompt_length:].sum(dim=1) - 1; prompts left-padded, responses "
        "right-padded; non_tensor_batch['uid'] groups rollouts (ray_trainer.py "
        "compute_advantage: index=data.non_tensor_batch['uid'])",
        "non_tensor_keys": ["uid"],
        # The keys whose line carries no shape comment: rm_scores is zeros_like(response_mask),
        # response_logprobs are padded to rollout.response_length.
        "shapes": {
            "rollout_log_probs": "[bsz, response_length]",
            "rm_scores": "[bsz, response_length]",
        },
    },
    "sample": {
        "invariants": [
            "len(loss_mask) == response_length",
            "len(rollout_log_probs) == response_length",
            "len(tokens) >= response_length",
        ],
        "why": "miles/utils/types.py Sample.validate; slime and miles take the response as "
        "tokens[-response_length:] (e.g. miles/rollout/generate_utils/prefill_logprobs.py)",
    },
    "openrlhf": {
        "dtypes": {
            "sequences": "int64",
            "attention_mask": "int64",
            "action_mask": "bool",
            "rollout_log_probs": "float32",
            "rewards": "float32",
            "response_length": "int64",
            "truncated": "bool",
            "total_length": "float32",
        },
        "action_length": "T - 1",
        "why": "openrlhf/trainer/ppo_utils/samples_generator.py "
        "_process_response_into_experience: sequences torch.tensor(dtype=torch.long), "
        "attention_mask torch.ones(dtype=torch.long), action_mask = action_mask[1:truncate] "
        "(annotated torch.BoolTensor), rollout_log_probs[1:truncate] (floats), rewards "
        "torch.tensor([reward]), response_length = last - first action index + 1, truncated "
        "torch.tensor([bool]), total_length attention_mask.float().sum()",
    },
    "tinker": {
        "loss_inputs": {
            "cross_entropy": ["target_tokens", "weights"],
            "importance_sampling": ["target_tokens", "logprobs", "advantages"],
            "ppo": ["target_tokens", "logprobs", "advantages"],
        },
        "alignment": "model_input = tokens[:-1]; every loss_fn_inputs array has one entry per "
        "input position, for the next token (target_tokens = tokens[1:])",
        "why": "https://tinker-docs.thinkingmachines.ai/losses (required loss_fn_inputs per "
        "loss, the shift by one)",
    },
}


def _show(clone: Path, commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", str(clone), "show", f"{commit}:{path}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def _comment(lines: list[str], lineno: int) -> str:
    _, sep, comment = lines[lineno - 1].partition("  # ")
    return comment.strip() if sep else ""


def _class(tree: ast.AST, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def dataclass_fields(source: str, name: str) -> dict[str, dict[str, str]]:
    """Annotated fields of class ``name`` (not of classes nested in it)."""
    lines = source.splitlines()
    fields = {}
    for node in _class(ast.parse(source), name).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            field = {"type": ast.unparse(node.annotation), "comment": _comment(lines, node.lineno)}
            value = node.value
            if isinstance(value, ast.Call) and ast.unparse(value.func) == "tensor_field":
                field["role"] = ast.literal_eval(value.args[0])
            fields[node.target.id] = field
    return fields


def enum_values(source: str, outer: str, name: str) -> list[str]:
    nested = _class(_class(ast.parse(source), outer), name)
    return [
        ast.literal_eval(node.value)
        for node in nested.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
    ]


def verl_batch_keys(source: str) -> dict[str, str]:
    """The keys of the TensorDicts (and later ``batch[...] =``) in the agent loop's
    post-processing, with the shape comment on (or just above) each key."""
    lines = source.splitlines()
    tree = ast.parse(source)
    keys: dict[str, str] = {}
    for function in ast.walk(tree):
        if not (isinstance(function, ast.FunctionDef) and function.name == "_postprocess"):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "TensorDict":
                literal = node.args[0]
                assert isinstance(literal, ast.Dict)
                for key in literal.keys:
                    if isinstance(key, ast.Constant):
                        above = lines[key.lineno - 2].strip()
                        shape = _comment(lines, key.lineno) or above.removeprefix("# ")
                        keys[str(key.value)] = shape
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
                target = node.targets[0]
                if ast.unparse(target.value) == "batch" and isinstance(target.slice, ast.Constant):
                    keys.setdefault(str(target.slice.value), "")
            if (
                isinstance(node, ast.Subscript)
                and ast.unparse(node.value) == "optional_outputs"
                and isinstance(node.slice, ast.Constant)
            ):
                keys.setdefault(str(node.slice.value), "")
    return keys


def build(clones: dict[str, Path]) -> dict[str, Any]:
    def show(name: str, path: str) -> str:
        return _show(clones[name], PINS[name][1], path)

    def cited(name: str, path: str) -> dict[str, str]:
        return {"repo": PINS[name][0], "commit": PINS[name][1], "path": path}

    datum = ast.parse(show("tinker", TINKER["datum"]))
    key_to_type = next(
        ast.literal_eval(n.value)
        for n in ast.walk(datum)
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_KEY_TO_TYPE"
    )
    chunk = dataclass_fields(show("tinker", TINKER["chunk"]), "EncodedTextChunk")
    chunk_type = next(
        ast.literal_eval(n.value)
        for n in _class(ast.parse(show("tinker", TINKER["chunk"])), "EncodedTextChunk").body
        if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "type" and n.value
    )
    return {
        "about": (
            "Extracted by tests/support/trainer_formats.py; facts from the cited sources, no code."
        ),
        "verl": {
            "source": cited("verl", VERL_AGENT_LOOP),
            "batch_keys": verl_batch_keys(show("verl", VERL_AGENT_LOOP)),
            **READ["verl"],
        },
        **{
            name: {
                "source": cited(name, SAMPLE[name]),
                "fields": dataclass_fields(show(name, SAMPLE[name]), "Sample"),
                "status": enum_values(show(name, SAMPLE[name]), "Sample", "Status"),
                **READ["sample"],
            }
            for name in ("slime", "miles")
        },
        "openrlhf": {
            "source": cited("openrlhf", EXPERIENCE),
            "fields": dataclass_fields(show("openrlhf", EXPERIENCE), "Experience"),
            **READ["openrlhf"],
        },
        "tinker": {
            "source": {name: cited("tinker", path) for name, path in TINKER.items()},
            "loss_fn_input_dtypes": key_to_type,
            "model_input_fields": list(
                dataclass_fields(show("tinker", TINKER["model_input"]), "ModelInput")
            ),
            "chunk_fields": {name: field["type"] for name, field in chunk.items()},
            "chunk_type": chunk_type,
            **READ["tinker"],
        },
    }


def main(argv: list[str]) -> None:
    clones = {name: Path(path) for name, path in (arg.split("=", 1) for arg in argv)}
    missing = set(PINS) - set(clones)
    if missing:
        raise SystemExit(f"give a git clone for each of {sorted(missing)} as NAME=PATH")
    OUT.write_text(json.dumps(build(clones), indent=2) + "\n")
    print(OUT)


if __name__ == "__main__":
    main(sys.argv[1:])
