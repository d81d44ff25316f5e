"""Routed experts of a MoE policy (routing replay): the experts each token position went to.

A :class:`RoutedExperts` block holds rows for the token positions ``[start, start + rows)`` of
one token sequence (a step's prompt + completion, or a segment's tokens). Row ``i`` holds, for
every MoE layer, the ``top_k`` expert ids that position ``start + i`` was routed to: ``data`` is
the row-major ``[rows, layers, top_k]`` array of little-endian ``dtype`` values, base64 in JSON.
``dtype`` is the narrowest that fits the model's expert count (``uint8`` up to 256 experts, as
vLLM picks it). Decode: ``numpy.frombuffer(base64.b64decode(data), dtype).reshape(shape)``
with ``dtype`` ``"u1"``, ``"<u2"`` or ``"<i4"``; or :meth:`RoutedExperts.to_numpy`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.arrays import Base64Bytes

if TYPE_CHECKING:
    import numpy as np

ExpertDType = Literal["uint8", "uint16", "int32"]
NUMPY_DTYPE: dict[str, str] = {"uint8": "u1", "uint16": "<u2", "int32": "<i4"}
WIDTH: dict[str, int] = {"uint8": 1, "uint16": 2, "int32": 4}


class RoutedExperts(BaseModel):
    """Expert ids per token position for ``[start, start + shape[0])``."""

    model_config = ConfigDict(frozen=True)

    start: int = Field(ge=0, description="Token position of the first row.")
    shape: tuple[int, int, int] = Field(description="[rows, MoE layers, experts per token]")
    dtype: ExpertDType = Field(description="Element type of data (little-endian).")
    data: Base64Bytes = Field(description="Row-major [rows, layers, top_k] array.")

    @model_validator(mode="after")
    def _sized(self) -> RoutedExperts:
        if len(self.data) != self.shape[0] * self.row_bytes:
            need = self.shape[0] * self.row_bytes
            raise ValueError(f"data has {len(self.data)} bytes, shape {self.shape} needs {need}")
        return self

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def end(self) -> int:
        """One past the last position with a row."""
        return self.start + self.shape[0]

    @property
    def row_bytes(self) -> int:
        return self.shape[1] * self.shape[2] * WIDTH[self.dtype]

    def layout(self) -> tuple[int, int, str]:
        return self.shape[1], self.shape[2], self.dtype

    def between(self, lo: int, hi: int) -> RoutedExperts | None:
        """The rows of positions ``[lo, hi)`` this block holds, or None if it holds none."""
        lo, hi = max(lo, self.start), min(hi, self.end)
        if hi <= lo:
            return None
        cut = self.data[(lo - self.start) * self.row_bytes : (hi - self.start) * self.row_bytes]
        return self.model_copy(
            update={"start": lo, "shape": (hi - lo, *self.shape[1:]), "data": cut}
        )

    def to_numpy(self) -> np.ndarray:
        import numpy as np  # only readers that want arrays pay for numpy

        return np.frombuffer(self.data, NUMPY_DTYPE[self.dtype]).reshape(self.shape)
