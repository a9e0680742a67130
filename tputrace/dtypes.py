"""Element sizes of the dtypes traces and captures name: one table of bits per element, keyed by the trace's short
names (`f32`, `bf16`, `i8`, `f8e4m3fn`), and each other spelling mapped onto those names: XLA's HLO type names
(`s32`, `pred`) and `PrimitiveType` numbers, NumPy's names (`float32`), torch.profiler's `Input type` names
(`c10::BFloat16`) and c10's `ScalarType` names (`BFloat16`). Imports neither torch nor jax."""

from __future__ import annotations

# The trace's short dtype name -> bits per element.
BITS: dict[str, int] = {
    "f64": 64, "f32": 32, "tf32": 32, "bf16": 16, "f16": 16,
    "f8e5m2": 8, "f8e4m3fn": 8, "f8e4m3": 8, "f8e3m4": 8, "f8e4m3b11fnuz": 8, "f8e5m2fnuz": 8, "f8e4m3fnuz": 8,
    "f8e8m0fnu": 8, "f4e2m1fn": 4,
    "i64": 64, "i32": 32, "i16": 16, "i8": 8, "i4": 4, "i2": 2, "i1": 1,
    "u64": 64, "u32": 32, "u16": 16, "u8": 8, "u4": 4, "u2": 2, "u1": 1,
    "bool": 8, "b8": 8, "c128": 128, "c64": 64, "c32": 32,
}
# The short names of whole-byte dtypes -> bytes per element.
DTYPE_BYTES: dict[str, int] = {name: bits // 8 for name, bits in BITS.items() if bits % 8 == 0}

# xla_data.proto's PrimitiveType -> the short name (tuples, tokens and opaque values by their kind).
PRIMITIVE_TYPES: dict[int, str] = {
    1: "bool", 2: "i8", 3: "i16", 4: "i32", 5: "i64", 6: "u8", 7: "u16", 8: "u32", 9: "u64", 10: "f16", 11: "f32",
    12: "f64", 13: "tuple", 14: "opaque", 15: "c64", 16: "bf16", 17: "token", 18: "c128", 19: "f8e5m2",
    20: "f8e4m3fn", 21: "i4", 22: "u4", 23: "f8e4m3b11fnuz", 24: "f8e5m2fnuz", 25: "f8e4m3fnuz", 26: "i2", 27: "u2",
    28: "f8e4m3", 29: "f8e3m4", 30: "i1", 31: "u1", 32: "f4e2m1fn", 33: "f8e8m0fnu",
}
# HLO text's element type names -> the short name (floats other than these are spelled alike).
HLO_NAMES: dict[str, str] = {
    "pred": "bool", "s1": "i1", "s2": "i2", "s4": "i4", "s8": "i8", "s16": "i16", "s32": "i32", "s64": "i64",
}
# NumPy's (and so JAX's) dtype names -> the short name.
NUMPY_NAMES: dict[str, str] = {
    "float64": "f64", "float32": "f32", "bfloat16": "bf16", "float16": "f16", "int64": "i64", "int32": "i32",
    "int16": "i16", "int8": "i8", "uint64": "u64", "uint32": "u32", "uint16": "u16", "uint8": "u8", "bool": "bool",
    "complex64": "c64", "complex128": "c128", "float8_e4m3fn": "f8e4m3fn", "float8_e5m2": "f8e5m2",
    "float8_e4m3fnuz": "f8e4m3fnuz", "float8_e5m2fnuz": "f8e5m2fnuz",
}
# torch.profiler's `Input type` names (C++ type names) -> the short name.
PROFILER_NAMES: dict[str, str] = {
    "float": "f32", "double": "f64", "c10::Half": "f16", "c10::BFloat16": "bf16", "int": "i32", "long int": "i64",
    "short int": "i16", "signed char": "i8", "unsigned char": "u8", "bool": "bool", "c10::complex<float>": "c64",
    "c10::complex<double>": "c128", "c10::Float8_e4m3fn": "f8e4m3fn", "c10::Float8_e5m2": "f8e5m2",
}
# c10's ScalarType names (`record_param_comms`'s `dtype`) -> the short name.
SCALAR_TYPES: dict[str, str] = {
    "Float": "f32", "Double": "f64", "Half": "f16", "BFloat16": "bf16", "Long": "i64", "Int": "i32", "Short": "i16",
    "Char": "i8", "Byte": "u8", "Bool": "bool", "ComplexFloat": "c64", "ComplexDouble": "c128", "ComplexHalf": "c32",
    "Float8_e4m3fn": "f8e4m3fn", "Float8_e5m2": "f8e5m2", "Float8_e4m3fnuz": "f8e4m3fnuz",
    "Float8_e5m2fnuz": "f8e5m2fnuz", "UInt16": "u16", "UInt32": "u32", "UInt64": "u64",
}


def element_bytes(name: str | None) -> int | None:
    """Bytes per element of a short dtype name; None for an unknown name or a type of no whole byte size."""
    return DTYPE_BYTES.get(name) if name is not None else None


def hlo_bits(name: str) -> int | None:
    """Bits per element of an HLO element type name (`s32`, `pred`, `bf16`, `f8e4m3fn`); None for an unknown one."""
    return BITS.get(HLO_NAMES.get(name, name))
