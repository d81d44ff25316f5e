"""Events of ``<prefix>.control``: one partition, one total order every ingress replica applies.

Every replica reads the whole log (no consumer group) from the beginning at start, so a replica
started during a pause learns it, then follows. The union :data:`ControlEvent` is the contract;
a new command is a new model with its own ``type`` added to :data:`CONTROL_EVENTS` and to the
union. Readers skip (and log) a ``type`` or ``schema_version`` they do not know.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from schemas.events import SCHEMA_VERSION

PauseMode = Literal["keep", "abort"]
Backend = Literal["vllm", "sglang"]


class _Control(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    event_time: float = Field(description="Unix seconds at the publisher.")
    issued_by: str = Field("", description="Who published it (cli, admin endpoint, a trainer).")


class Pause(_Control):
    """Stop admitting new generations. In-flight ones are frozen in the engine (``keep``) or
    ended at a token boundary and continued after resume as the same response (``abort``)."""

    type: Literal["pause"] = "pause"
    mode: PauseMode = Field("keep", description="keep: freeze in-flight; abort: end and continue.")


class Resume(_Control):
    """Admit generations again; frozen ones go on, aborted ones continue."""

    type: Literal["resume"] = "resume"


class SetWeightVersion(_Control):
    """The label of the weights the engines sample with from now on."""

    type: Literal["set_weight_version"] = "set_weight_version"
    version: str = Field(min_length=1)


class _EngineChange(_Control):
    url: str = Field(pattern=r"^https?://\S+$", description="The engine's base URL.")


class EngineAdded(_EngineChange):
    """Route sessions to this engine too (a new one, or a drained one back in service). Its
    share of sessions is ``weight`` relative to the others' (a canary takes e.g. 0.1)."""

    type: Literal["engine_added"] = "engine_added"
    backend: Backend = Field("vllm", description="Its API: vllm or sglang.")
    weight: float = Field(1.0, gt=0, description="Relative share of sessions.")


class EngineDrained(_EngineChange):
    """No new calls to this engine; calls in flight there finish, its sessions move on."""

    type: Literal["engine_drained"] = "engine_drained"


class EngineRemoved(_EngineChange):
    """Drain this engine and forget it (its client closes after its last call)."""

    type: Literal["engine_removed"] = "engine_removed"


# To add a command: a model above, then here (the union, the tuple of models the docs show).
AnyControl = Pause | Resume | SetWeightVersion | EngineAdded | EngineDrained | EngineRemoved
CONTROL_EVENTS: tuple[type[_Control], ...] = (
    Pause,
    Resume,
    SetWeightVersion,
    EngineAdded,
    EngineDrained,
    EngineRemoved,
)
ControlEvent = Annotated[AnyControl, Field(discriminator="type")]
control_adapter: TypeAdapter[AnyControl] = TypeAdapter(ControlEvent)
