"""ParamStruct packs its fields back to back; the compiler aligns each field to its size. A
field order that the compiler would pad (a 4-byte field followed by an 8-byte one at an odd
4-byte offset) makes the kernel read other bytes than the host wrote: such a struct is refused
when it is declared, and every family's struct is free of it."""
import pytest

from nvrtc_gather import kernels
from nvrtc_gather.jit.spec import ParamStruct


def test_a_field_the_compiler_would_pad_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"X\.b: a 8-byte field at byte 4 would be padded"):
        ParamStruct("X", (("a", "i32"), ("b", "ptr"), ("error", "ptr")))
    with pytest.raises(ValueError, match=r"Y\.error: a 8-byte field at byte 12"):  # five i32 before error, as once
        ParamStruct("Y", (("p", "ptr"), ("a", "i32"), ("error", "ptr")))


def test_two_i32_fields_keep_the_next_pointer_aligned():
    s = ParamStruct("Z", (("a", "i32"), ("b", "i32"), ("error", "ptr")))
    assert s.layout.size == 16


def test_every_registered_struct_is_unpadded():
    for module in kernels.ALL_MODULES:
        offset = 0
        for _, kind in module.params.fields:
            size = 4 if kind == "i32" else 8
            assert offset % size == 0, (module.params.name, offset)
            offset += size
        assert offset == module.params.layout.size
