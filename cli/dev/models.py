"""Which tiny model a command builds or serves: ``titoflow build-model`` (the agentic policy by
default; ``--random``, ``--moe``, ``--vl``) and the model ``titoflow up`` hands its engine.

Invariant: ``up`` builds only at its default path (:data:`DEFAULT_MODEL_DIR`, the agentic
policy's place); any other path it is given is served as it is when it holds a model, and
refused in one line (:class:`titoflow.settings.SettingError`) when it does not, nothing written
to it. Only ``build-model`` builds elsewhere.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from cli.dev import agent_policy, model_build
from cli.dev.vl_policy import build_vl_policy
from titoflow.settings import SettingError, Settings

DEFAULT_MODEL_DIR: Path = Settings.model_fields["model_path"].default


def build_agent_policy(out_dir: Path) -> Path:
    """Write the tiny agentic policy (:mod:`cli.dev.agent_policy`) at ``out_dir``
    (idempotent) and return it."""
    src = model_build.tokenizer_source_dir()
    recipe = model_build.recipe_hash(
        agent_policy.SEED, src, agent_policy.CONFIG | agent_policy.RECIPE
    )
    return model_build.build_model_dir(
        out_dir,
        recipe,
        "agent",
        agent_policy.SEED,
        agent_policy.CONFIG,
        lambda: agent_policy.make_weights(src),
    )


def model_for_up(settings: Settings) -> Path:
    """The model directory ``up``'s engine serves from ``settings.model_path``: at the default
    path the agentic policy, built or brought up to date; at any other path the directory as it
    is (whoever made it, whatever recipe its stamp records), or a refusal naming what it lacks."""
    path = Path(os.path.abspath(settings.model_path))
    if path == Path(os.path.abspath(DEFAULT_MODEL_DIR)):
        return build_agent_policy(path)
    if not path.exists():
        lacks = "does not exist"
    elif missing := model_build.missing_model_parts(path):
        lacks = f"holds no model (it lacks {', '.join(missing)})"
    else:
        return path
    raise SettingError(
        "TITOFLOW_MODEL_PATH",
        f"{path} {lacks}; up serves a given model as it is and builds only its default "
        f"({DEFAULT_MODEL_DIR}): point it at a model directory, or build one there first "
        f"(titoflow build-model --out {path})",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="titoflow build-model",
        description="Write a tiny deterministic Qwen3 model (weights + Qwen3 tokenizer): by "
        "default the agentic policy the local stack serves.",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="Model directory (default: settings.model_path; with --random "
        f"{model_build.RANDOM_MODEL_DIR}; with --moe settings.moe_model_path; with --vl "
        ".models/tiny-qwen3-vl).",
    )
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument(
        "--random", action="store_true", help="The random-weight model the pipeline tests use."
    )
    kind.add_argument(
        "--moe", action="store_true", help="The random-weight Qwen3-MoE sibling (routing replay)."
    )
    kind.add_argument(
        "--vl",
        action="store_true",
        help="The random-weight Qwen3-VL policy that takes images (served with the engine's "
        "vision extras, scripts/setup-engine.sh).",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="Weight seed of --random / --moe / --vl (default: 0)."
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    build: Callable[[Path], Path] = build_agent_policy
    default, setting = Settings().model_path, "TITOFLOW_MODEL_PATH"  # names it in a refusal
    if args.random or args.moe:
        build = partial(model_build.build_tiny_model, seed=args.seed, moe=args.moe)
        default = Settings().moe_model_path if args.moe else model_build.RANDOM_MODEL_DIR
        setting = "TITOFLOW_MOE_MODEL_PATH" if args.moe else "--out"
    elif args.vl:
        build = partial(build_vl_policy, seed=args.seed)
        default, setting = model_build.VL_MODEL_DIR, "--out"
    if args.out is not None:
        default, setting = args.out, "--out"
    try:
        path = build(default)
    except SettingError as exc:
        print(f"titoflow build-model: {setting}: {exc.message}", file=sys.stderr)
        return 2
    print(path)
    if model_build.made_by_titoflow(path):
        print(f"built or current in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    else:
        print(f"{path} holds a model titoflow did not make: left as it is", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
