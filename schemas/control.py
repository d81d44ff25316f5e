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


# To add a command: a model above, then here (the union, the tuple of models the docs show).
AnyControl = Pause | Resume | SetWeightVersion
CONTROL_EVENTS: tuple[type[_Control], ...] = (Pause, Resume, SetWeightVersion)
ControlEvent = Annotated[AnyControl, Field(discriminator="type")]
control_adapter: TypeAdapter[AnyControl] = TypeAdapter(ControlEvent)
