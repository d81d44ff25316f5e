"""Packed encodings of the large numeric arrays in events.

Token ids, logprobs and masks dominate event bytes, so they travel as base64 of little-endian
fixed-width values (int32 token ids, float32 logprobs, uint8 masks/sources) instead of JSON lists.
vLLM computes logprobs in float32, so float32 packing keeps the engine's values exactly.
In Python they are lists; validation accepts either a list or the packed string, so
hand-written events and replays of old JSON stay readable. A packed string decodes to a
:class:`PackedList`, a list that keeps the array it was read from (``packed``, equal to the
list as long as neither is changed in place, which nothing does to an event's arrays), so a
reader that works on arrays (the worker) need not convert the list back. Decoding elsewhere:
``numpy.frombuffer(base64.b64decode(s), dtype="<i4")`` (``"<f4"``, ``"u1"``).
"""

from __future__ import annotations

import base64
import struct
import sys
from array import array
from typing import Annotated, Any

from pydantic import (
    BeforeValidator,
    PlainSerializer,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    WrapValidator,
)

_NEEDS_SWAP = sys.byteorder != "little"


class PackedList(list[Any]):
    """The values of an array, as a list, with the array itself (``packed``): decoded from an
    event, or made from one to be published."""

    __slots__ = ("packed",)

    def __init__(self, packed: array[Any]) -> None:
        super().__init__(packed.tolist())
        self.packed = packed


def pack(values: list[int] | list[float], typecode: str) -> str:
    if isinstance(values, PackedList) and values.packed.typecode == typecode:
        packed = values.packed
        if _NEEDS_SWAP:
            packed = packed[:]
            packed.byteswap()
        return base64.b64encode(packed).decode("ascii")
    # struct packs a list twice as fast as array(typecode, values), little-endian on any host.
    return base64.b64encode(struct.pack(f"<{len(values)}{typecode}", *values)).decode("ascii")


def unpack(data: str, typecode: str) -> PackedList:
    packed = array(typecode)
    packed.frombytes(base64.b64decode(data, validate=True))
    if _NEEDS_SWAP:
        packed.byteswap()
    return PackedList(packed)


def as_array(values: list[Any], typecode: str) -> array[Any]:
    """``values`` as an array of ``typecode``: the one it was decoded from if it was packed."""
    if isinstance(values, PackedList) and values.packed.typecode == typecode:
        return values.packed
    return array(typecode, values)


def _checked_width(typecode: str, width: int) -> str:
    if array(typecode).itemsize != width:
        raise RuntimeError(f"array typecode {typecode!r} is not {width} bytes wide here")
    return typecode


def _packed(typecode: str, numpy_dtype: str) -> tuple[Any, ...]:
    """Validator, serializer and JSON Schema of one packed array type."""

    def parse(value: Any, validate: ValidatorFunctionWrapHandler) -> Any:
        # A fixed-width array's values are ints (floats) already: validating each is wasted.
        return unpack(value, typecode) if isinstance(value, str) else validate(value)

    return (
        WrapValidator(parse),
        PlainSerializer(lambda v: pack(v, typecode), return_type=str, when_used="json"),
        WithJsonSchema(
            {
                "type": "string",
                "contentEncoding": "base64",
                "description": f"base64 of a packed little-endian {numpy_dtype} array",
            },
            mode="serialization",
        ),
    )


Int32Array = Annotated[list[int], *_packed(_checked_width("i", 4), "int32 (numpy '<i4')")]
Float32Array = Annotated[list[float], *_packed(_checked_width("f", 4), "float32 (numpy '<f4')")]
UInt8Array = Annotated[list[int], *_packed(_checked_width("B", 1), "uint8 (numpy 'u1')")]


def _decode_base64(value: Any) -> Any:
    return base64.b64decode(value, validate=True) if isinstance(value, str) else value


# Raw bytes whose layout a sibling field describes (routed experts: dtype and shape).
Base64Bytes = Annotated[
    bytes,
    BeforeValidator(_decode_base64),
    PlainSerializer(
        lambda v: base64.b64encode(v).decode("ascii"), return_type=str, when_used="json"
    ),
    WithJsonSchema(
        {"type": "string", "contentEncoding": "base64", "description": "base64 of raw bytes"},
        mode="serialization",
    ),
]
