"""The trainer formats' published definitions as the format tests read them: ``DEFINED``
(tests/support/trainer_formats.json, extracted by tests/support/trainer_formats.py), slime's and
miles' ``Sample.Status`` and the part of their ``Sample`` their reward processing reads, and
:func:`conforms`, whether a value fits one of ``Sample``'s field annotations.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any

DEFINED = json.loads(Path(__file__).with_name("trainer_formats.json").read_text())


class Status(Enum):
    """``Sample.Status`` as slime and miles define it (utils/types.py; checked against both)."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


class SlimeSample:
    """What slime's and miles' reward processing reads of a ``Sample``: its fields, and
    ``get_reward_value`` as both write it (slime utils/types.py:246, miles :177)."""

    reward: Any

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def get_reward_value(self, args: Any) -> Any:
        return self.reward if not args.reward_key else self.reward[args.reward_key]


def conforms(value: Any, annotation: str, status: list[str]) -> bool:
    """Whether ``value`` fits a field annotation of Sample (the forms it uses)."""
    options = [option.strip() for option in annotation.split(" | ")]
    checks = {
        "None": lambda v: v is None,
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, float),
        "str": lambda v: isinstance(v, str),
        "dict": lambda v: isinstance(v, dict),
        "dict[str, Any]": lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v),
        "list[int]": lambda v: isinstance(v, list) and all(type(x) is int for x in v),
        "list[float]": lambda v: isinstance(v, list) and all(type(x) is float for x in v),
        "list[str]": lambda v: isinstance(v, list) and all(type(x) is str for x in v),
        "Status": lambda v: isinstance(v, Status) and v.value in status,
    }
    return any(checks[option](value) for option in options if option in checks)
