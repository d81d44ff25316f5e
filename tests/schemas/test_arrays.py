"""The packed arrays of events: a packed string and a list decode to the same values, the
packed one keeping its array; a list is still checked item by item."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from schemas.arrays import Float32Array, Int32Array, PackedList, as_array, pack

ints = TypeAdapter(Int32Array)
floats = TypeAdapter(Float32Array)


@given(st.lists(st.integers(-(2**31), 2**31 - 1)))
def test_packed_ints_decode_to_the_list_and_keep_their_array(values: list[int]) -> None:
    decoded = ints.validate_json(ints.dump_json(values))
    assert isinstance(decoded, PackedList)
    assert decoded == values and decoded.packed.tolist() == values
    assert as_array(decoded, "i") is decoded.packed
    assert ints.dump_json(decoded) == ints.dump_json(values)


@given(st.lists(st.floats(width=32, allow_nan=False)))
def test_packed_floats_decode_to_the_list(values: list[float]) -> None:
    decoded = floats.validate_python(pack(values, "f"))
    assert decoded == values and as_array(decoded, "f").tolist() == values
    assert as_array(values, "f").tolist() == values  # a plain list is converted


def test_a_list_is_still_validated_item_by_item() -> None:
    assert ints.validate_python([1, 2]) == [1, 2]
    with pytest.raises(ValidationError):
        ints.validate_python([1, "x"])
    with pytest.raises(ValidationError):
        ints.validate_python("not base64!")
