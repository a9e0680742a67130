"""What a data-moving device op moves: its kind, direction, array shape and size, read from its name and the shapes an
import keeps (`tputrace.importers.hlo_text`: an XLA op's operands and output, with their layouts' memory spaces).

A layout's `S(n)` is the array's memory space; without one the array is in the device's own memory (HBM). On a TPU
`S(5)` is host memory (what `memory_kind="pinned_host"` places, and where XLA's host offloading keeps arrays).
A GPU's copies are kernels named by CUDA's runtime (`Memcpy HtoD (Pageable -> Device)` in torch.profiler, `MemcpyH2D`
in XProf).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.dtypes import hlo_bits
from tputrace.importers.hlo_text import MOVEMENT_OPCODES, opcode_of

if TYPE_CHECKING:
    from tputrace.analysis.host_callbacks import HostCallback

HOST_MEMORY_SPACE = 5
HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE = "host to device", "device to host", "device to device"
_GPU_COPY = re.compile(r"^Memcpy ?(HtoD|DtoH|DtoD|PtoP|HtoH|H2D|D2H|D2D|P2P|H2H)\b")
_GPU_DIRECTIONS = {"HtoD": HOST_TO_DEVICE, "H2D": HOST_TO_DEVICE, "DtoH": DEVICE_TO_HOST, "D2H": DEVICE_TO_HOST,
                   "DtoD": DEVICE_TO_DEVICE, "D2D": DEVICE_TO_DEVICE, "PtoP": "between devices",
                   "P2P": "between devices", "HtoH": "host to host", "H2H": "host to host"}
_HOST_FEEDS = {"infeed": HOST_TO_DEVICE, "outfeed": DEVICE_TO_HOST}
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\](\{[^{}]*(?:\([^()]*\)[^{}]*)*\})?")
_SPACE = re.compile(r"S\((\d+)\)")
_OPERAND_NAME = re.compile(r"%([\w.-]+)\s*$")


@dataclass(frozen=True)
class Movement:
    """A data-moving op as its name and shapes tell it: kind (`async copy`, `infeed`, `memcpy`...), direction, the
    array (shape without layout, bytes) and the instruction that made it, where known."""

    kind: str
    direction: str
    shape: str | None = None
    bytes: int | None = None
    start_op: str | None = None  # a copy-done's copy-start
    operand: str | None = None  # a copy-start's operand: the instruction whose result it copies


@dataclass(frozen=True)
class MovedArray:
    """The data one op (or kernel) moves: its waits over the capture, on every device that ran it."""

    op: str
    kind: str
    direction: str
    shape: str | None
    bytes: int | None
    made_by: str | None  # the instruction whose result a copy moves (`param.1`, `broadcast_add_fusion.2`)
    made_by_name: str | None  # JAX's name of it, from its HLO metadata (`ws[1]`, `jit(f)/add`)
    program: str | None
    frame_id: int | None
    calls: int
    devices: int
    device_ns: int
    waiting_ns: int  # the part of `device_ns` no compute ran on the same device


@dataclass(frozen=True)
class DataMovementData:
    devices: int = 0
    wall_ns: int = 0
    busy_ns: int = 0  # every device's busy time (the union of its ops' or kernels' times), summed
    waiting_ns: int = 0
    idle_ns: int = 0
    compile_ns: int = 0  # the union of the capture's compiles, during which the devices wait for their programs
    arrays: tuple[MovedArray, ...] = ()
    callback_ns: int = 0  # the devices' waits for host callbacks (`tputrace.analysis.host_callbacks`)
    callbacks: tuple[HostCallback, ...] = ()  # the callbacks (`HostCallback`), most waited first


def is_movement(name: str) -> bool:
    """Whether a device op or kernel named `name` moves data rather than computes."""
    return opcode_of(name) in MOVEMENT_OPCODES or _GPU_COPY.match(name) is not None


def movement(name: str, inputs: str | None, outputs: str | None) -> Movement:
    """What the op named `name` moves, from its operands and output shape text (None where the import has none)."""
    gpu = _GPU_COPY.match(name)
    if gpu is not None:
        return Movement("memcpy", _GPU_DIRECTIONS[gpu.group(1)])
    opcode = opcode_of(name)
    operand = _OPERAND_NAME.search(inputs or "")
    operand_name = operand.group(1) if operand else None
    if opcode in ("copy-start", "copy-done"):
        # copy-start's output and copy-done's operand are the tuple (destination, source, context).
        pair = outputs if opcode == "copy-start" else inputs
        arrays = _ARRAY.findall(pair or "")
        if len(arrays) >= 2:
            destination, source = arrays[0], arrays[1]
            return Movement("async copy", _direction(_space(source), _space(destination)), _shape(destination),
                            _bytes(destination), operand_name if opcode == "copy-done" else None,
                            operand_name if opcode == "copy-start" else None)
        return Movement("async copy", "between memory spaces")
    arrays = _ARRAY.findall(outputs or "")
    data = [array for array in arrays if array[0] != "token"]
    direction = _HOST_FEEDS.get(opcode, "between devices")
    if opcode == "outfeed":
        data = [array for array in _ARRAY.findall(inputs or "") if array[0] != "token"]
    kind = opcode.removesuffix("-done")
    return Movement(kind, direction, _shape(data[0]) if data else None,
                    sum(_bytes(array) or 0 for array in data) or None)


def memory_name(space: int) -> str:
    return "host memory" if space == HOST_MEMORY_SPACE else "device memory" if space == 0 else f"memory space S({space})"


def _space(array: tuple[str, str, str]) -> int:
    found = _SPACE.search(array[2] or "")
    return int(found.group(1)) if found else 0


def _direction(source: int, destination: int) -> str:
    if source == HOST_MEMORY_SPACE and destination == 0:
        return HOST_TO_DEVICE
    if source == 0 and destination == HOST_MEMORY_SPACE:
        return DEVICE_TO_HOST
    if source == destination:
        return f"within {memory_name(source)}"
    return f"{memory_name(source)} to {memory_name(destination)}"


def _shape(array: tuple[str, str, str]) -> str:
    return f"{array[0]}[{array[1]}]"


def _bytes(array: tuple[str, str, str]) -> int | None:
    bits = hlo_bits(array[0])
    if bits is None and array[0].startswith("f8"):
        bits = 8
    if bits is None:
        return None
    dims = [int(dim) for dim in array[1].split(",") if dim]
    return math.prod(dims) * bits // 8
