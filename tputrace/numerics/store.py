"""The numerics recording file: SQLite, its own format (docs/numerics-tool.md). Never imports torch.

Tables:
- `numerics_info(key, value)`: `format` ("tputrace-numerics"), `version`, `script`, `argv` (JSON), `mode`,
  `replay_steps`.
- `module_calls`: one row per module call and phase (forward, or backward for its gradients), in execution order.
- `tensor_digests`: the digest of each floating tensor of a row (outputs in the forward, input gradients in the
  backward), on the tpu and, where replayed, on the CPU.
- `full_tensors`: raw little-endian bytes of the tensors of the modules `--modules` names.
- `op_digests`: with `--ops`, the ops of the first divergent call, run again on the tpu and on the CPU.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tputrace.store.errors import TputraceError

FORMAT = "tputrace-numerics"
VERSION = 2

_SCHEMA = """
CREATE TABLE numerics_info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE module_calls (
    event_id INTEGER PRIMARY KEY,
    call_id INTEGER NOT NULL,
    step INTEGER NOT NULL,
    phase TEXT NOT NULL,
    module TEXT NOT NULL,
    module_type TEXT NOT NULL,
    path TEXT,
    line INTEGER,
    outcome TEXT NOT NULL,
    reason TEXT,
    divergence REAL,
    max_abs_difference REAL,
    tolerance REAL,
    reference_dtype TEXT,
    input_nonfinite INTEGER
);
CREATE TABLE tensor_digests (
    event_id INTEGER NOT NULL,
    tensor_index INTEGER NOT NULL,
    side TEXT NOT NULL,
    dtype TEXT NOT NULL,
    shape TEXT NOT NULL,
    l2_norm REAL,
    max_abs REAL,
    nonfinite INTEGER NOT NULL,
    sample TEXT NOT NULL,
    PRIMARY KEY (event_id, tensor_index, side)
);
CREATE TABLE full_tensors (
    event_id INTEGER NOT NULL,
    tensor_index INTEGER NOT NULL,
    side TEXT NOT NULL,
    dtype TEXT NOT NULL,
    shape TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (event_id, tensor_index, side)
);
CREATE TABLE op_digests (
    event_id INTEGER NOT NULL,
    op_index INTEGER NOT NULL,
    op_name TEXT NOT NULL,
    tpu_dtype TEXT NOT NULL,
    cpu_dtype TEXT,
    divergence REAL,
    tolerance REAL,
    PRIMARY KEY (event_id, op_index)
);
"""

COMPARED = "compared"
NOT_COMPARED = "not compared"
DIGEST_ONLY = "digest only"


@dataclass(frozen=True)
class TensorDigest:
    """Shape, dtype, L2 norm and largest magnitude of the finite values, count of NaN/Inf, a fixed sample."""

    dtype: str
    shape: tuple[int, ...]
    l2_norm: float
    max_abs: float
    nonfinite: int
    sample: list[float]


@dataclass
class ModuleCall:
    """One module call's forward, or its backward: where it ran, what was compared and how far it diverged."""

    event_id: int
    call_id: int
    step: int
    phase: str
    module: str
    module_type: str
    path: str | None
    line: int | None
    outcome: str = DIGEST_ONLY
    reason: str | None = None
    divergence: float | None = None
    max_abs_difference: float | None = None
    tolerance: float | None = None
    reference_dtype: str | None = None
    input_nonfinite: int | None = None  # NaN/Inf in a replayed forward's inputs (None: not replayed)
    tpu: dict[int, TensorDigest] = field(default_factory=dict)
    cpu: dict[int, TensorDigest] = field(default_factory=dict)

    @property
    def nonfinite(self) -> int:
        return sum(digest.nonfinite for digest in self.tpu.values())

    @property
    def cpu_nonfinite(self) -> int:
        return sum(digest.nonfinite for digest in self.cpu.values())

    @property
    def diverged(self) -> bool:
        return self.divergence is not None and self.tolerance is not None and not self.divergence <= self.tolerance


@dataclass(frozen=True)
class FullTensor:
    event_id: int
    tensor_index: int
    side: str
    dtype: str
    shape: tuple[int, ...]
    data: bytes


@dataclass(frozen=True)
class OpRow:
    """One op inside a call run again for `--ops`: its output's divergence from the CPU's (None: the CPU run
    has no such op)."""

    op_index: int
    op_name: str
    tpu_dtype: str
    cpu_dtype: str | None
    divergence: float | None
    tolerance: float | None

    @property
    def diverged(self) -> bool:
        return self.divergence is not None and self.tolerance is not None and not self.divergence <= self.tolerance


class NumericsWriter:
    """Writes a numerics recording; rows are kept until `flush` (called every `batch` calls and by `close`)."""

    def __init__(self, path: Path, info: dict[str, str], batch: int = 500) -> None:
        if path.exists():
            path.unlink()
        self._connection = sqlite3.connect(path)
        self._connection.executescript(_SCHEMA)
        rows = {"format": FORMAT, "version": str(VERSION), **info}
        self._connection.executemany("INSERT INTO numerics_info VALUES (?, ?)", sorted(rows.items()))
        self._pending: list[ModuleCall] = []
        self._tensors: list[FullTensor] = []
        self._batch = batch

    def add_call(self, call: ModuleCall) -> None:
        self._pending.append(call)
        if len(self._pending) >= self._batch:
            self.flush()

    def add_full_tensor(self, tensor: FullTensor) -> None:
        self._tensors.append(tensor)

    def add_ops(self, event_id: int, ops: list[OpRow]) -> None:
        with self._connection:
            self._connection.executemany(
                "INSERT INTO op_digests VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(event_id, o.op_index, o.op_name, o.tpu_dtype, o.cpu_dtype, o.divergence, o.tolerance) for o in ops],
            )

    def flush(self) -> None:
        calls, self._pending = self._pending, []
        tensors, self._tensors = self._tensors, []
        with self._connection:
            self._connection.executemany(
                "INSERT INTO module_calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        c.event_id,
                        c.call_id,
                        c.step,
                        c.phase,
                        c.module,
                        c.module_type,
                        c.path,
                        c.line,
                        c.outcome,
                        c.reason,
                        c.divergence,
                        c.max_abs_difference,
                        c.tolerance,
                        c.reference_dtype,
                        c.input_nonfinite,
                    )
                    for c in calls
                ],
            )
            self._connection.executemany(
                "INSERT INTO tensor_digests VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        c.event_id,
                        index,
                        side,
                        d.dtype,
                        json.dumps(list(d.shape)),
                        d.l2_norm,
                        d.max_abs,
                        d.nonfinite,
                        _sample_text(d.sample),
                    )
                    for c in calls
                    for side, digests in (("tpu", c.tpu), ("cpu", c.cpu))
                    for index, d in digests.items()
                ],
            )
            self._connection.executemany(
                "INSERT INTO full_tensors VALUES (?, ?, ?, ?, ?, ?)",
                [(t.event_id, t.tensor_index, t.side, t.dtype, json.dumps(list(t.shape)), t.data) for t in tensors],
            )

    def close(self) -> None:
        self.flush()
        self._connection.close()


def _sample_text(sample: list[float]) -> str:
    """JSON of the sample, with NaN and infinities as strings (JSON has no such numbers)."""
    return json.dumps([value if math.isfinite(value) else repr(value) for value in sample])


def _sample_values(text: str) -> list[float]:
    return [float(value) for value in json.loads(text)]


@dataclass
class NumericsRecording:
    """A numerics recording read back: its info and its module calls in execution order."""

    path: Path
    info: dict[str, str]
    calls: list[ModuleCall]
    ops: dict[int, list[OpRow]] = field(default_factory=dict)


def is_numerics_recording(path: str | Path) -> bool:
    """Whether `path` is a numerics recording (an SQLite file with the `numerics_info` table), not a trace."""
    candidate = Path(path)
    if not candidate.is_file():
        return False
    try:
        with open(candidate, "rb") as handle:
            if handle.read(16) != b"SQLite format 3\x00":
                return False
        connection = sqlite3.connect(f"file:{candidate}?mode=ro", uri=True)
        try:
            found = connection.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'numerics_info'").fetchone()
        finally:
            connection.close()
    except (OSError, sqlite3.DatabaseError):
        return False
    return found is not None


def read_recording(path: Path) -> NumericsRecording:
    """Read a numerics recording; `TputraceError` for a file that is not one."""
    if not path.is_file():
        raise TputraceError(f"no such numerics recording: {path}")
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            info = dict(connection.execute("SELECT key, value FROM numerics_info").fetchall())
            if info.get("format") != FORMAT:
                raise TputraceError(f"{path} is not a tputrace numerics recording")
            if int(info.get("version", "0")) > VERSION:
                raise TputraceError(f"{path} was written by a newer tputrace (numerics format {info['version']})")
            calls = {
                row[0]: ModuleCall(*row) for row in connection.execute("SELECT * FROM module_calls ORDER BY event_id")
            }
            for event_id, index, side, dtype, shape, l2_norm, max_abs, nonfinite, sample in connection.execute(
                "SELECT * FROM tensor_digests"
            ):
                digest = TensorDigest(
                    dtype, tuple(json.loads(shape)), _real(l2_norm), _real(max_abs), nonfinite, _sample_values(sample)
                )
                (calls[event_id].tpu if side == "tpu" else calls[event_id].cpu)[index] = digest
            ops: dict[int, list[OpRow]] = {}
            for event_id, *op in connection.execute("SELECT * FROM op_digests ORDER BY event_id, op_index"):
                ops.setdefault(event_id, []).append(OpRow(*op))
        finally:
            connection.close()
    except sqlite3.DatabaseError:
        raise TputraceError(f"{path} is not a tputrace numerics recording") from None
    return NumericsRecording(path, info, list(calls.values()), ops)


def _real(value: float | None) -> float:
    return math.nan if value is None else float(value)


def read_full_tensors(path: Path, event_ids: Iterable[int]) -> list[FullTensor]:
    """The full tensors stored for the given rows."""
    wanted = list(event_ids)
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        marks = ",".join("?" * len(wanted))
        rows = connection.execute(f"SELECT * FROM full_tensors WHERE event_id IN ({marks})", wanted).fetchall()
    finally:
        connection.close()
    return [FullTensor(e, i, s, d, tuple(json.loads(shape)), bytes(data)) for e, i, s, d, shape, data in rows]
