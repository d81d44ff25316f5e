"""Tokenizers of the model families (cli/dev/tokenizers), loaded once per test session."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from cli.dev.model_build import tokenizer_source_dir
from cli.dev.tokenizers import tokenizer_dir
from titoflow.tito.tokenizer import TextEncoder, load_tokenizer


@functools.cache
def family_tokenizer(family: str) -> Any:
    """The family's tokenizer and chat template (built once into ``.models/tokenizers``)."""
    return load_tokenizer(tokenizer_dir(family))


def family_token_id(family: str) -> Callable[[str], int | None]:
    """The id of a text the family's vocabulary holds as one token, else None (the lookup a
    grammar names its markers with, as ``ChatRenderer.token_id``)."""

    def token_id(text: str) -> int | None:
        ids = TextEncoder(family_tokenizer(family))(text)
        return ids[0] if len(ids) == 1 else None

    return token_id


@functools.cache
def qwen3() -> Any:
    return load_tokenizer(tokenizer_source_dir())


def function_tool(
    name: str,
    properties: dict[str, Any],
    description: str | None = None,
    required: list[str] | None = None,
) -> dict[str, Any]:
    """An OpenAI function tool taking an object of ``properties`` (keys in the order a template
    writes them: name, description, parameters; type, properties, required)."""
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required is not None:
        parameters["required"] = required
    described = {} if description is None else {"description": description}
    return {"type": "function", "function": {"name": name, **described, "parameters": parameters}}


def path_tool(name: str, description: str) -> dict[str, Any]:
    """An OpenAI function tool taking one string ``path``."""
    return function_tool(name, {"path": {"type": "string"}}, description)


# The family tests' tools: a call with a string, an integer, an object and a boolean argument
# (one required), and one without parameters.
CALL_TOOLS: list[dict[str, Any]] = [
    function_tool(
        "run",
        {
            "command": {"type": "string"},
            "timeout": {"type": "integer"},
            "env": {"type": "object"},
            "dry": {"type": "boolean"},
        },
        "Run a command",
        ["command"],
    ),
    {"type": "function", "function": {"name": "list_dir", "description": "List"}},
]
