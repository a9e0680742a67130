"""The chip's side of the report: matmul shapes padded for the target, each program on the roofline,
collectives, and memory over time. Aggregated in SQL; values are raw (ns, bytes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.analysis.chips import Chip
from tputrace.analysis.padding import pad_product
from tputrace.analysis.shapes import Matmul, matmuls_of, op_family, parse_specs
from tputrace.derived.run_facts import rank_offsets
from tputrace.store.records import SourceLocation
from tputrace.viewers.report.compile_data import MAX_SCATTER_POINTS

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

MEMORY_POINTS_PER_SERIES = 4_000


@dataclass
class MatmulShape:
    """One matrix product of a matmul-like op with given input shapes, padded for the target."""

    op: str
    inputs: str | None
    product: Matmul
    padded: tuple[int, int, int]
    wasted_share: float
    count: int
    total_ns: int
    fallback: bool
    module: str | None
    source: SourceLocation | None


@dataclass
class ShapeData:
    shapes: list[MatmulShape]
    target: Chip


def prepare_shapes(trace: Trace, target: Chip) -> ShapeData:
    """Matmul-like ops (dispatched to the chip, or run as CPU fallbacks) by input shapes, each product
    padded to the target's tiles (m) and MXU (k, n) as the padding analyzer pads it."""
    shapes: list[MatmulShape] = []
    for table, module_column in (("ops", "module_sid"), ("fallbacks", "NULL")):
        op_sids = [sid for (sid,) in trace.sql(f"SELECT DISTINCT op_sid FROM {table}") if op_family(trace.string(sid))]
        if not op_sids:
            continue
        marks = ", ".join("?" for _ in op_sids)
        rows = trace.sql(
            f"SELECT op_sid, inputs_sid, COUNT(*), COALESCE(SUM(dur_ns), 0), MIN({module_column}), MIN(frame_id) "
            f"FROM {table} WHERE op_sid IN ({marks}) GROUP BY op_sid, inputs_sid",
            op_sids,
        )
        for op_sid, inputs_sid, count, total_ns, module_sid, frame_id in rows:
            op, inputs = trace.string(op_sid) or "?", trace.string(inputs_sid)
            for product in matmuls_of(op, inputs):
                padding = pad_product(product, target)
                sublane = target.tile(product.dtype)[0]
                padded = (_round_up(product.m, sublane), _round_up(product.k, target.mxu), _round_up(product.n, target.mxu))
                shapes.append(MatmulShape(op, inputs, product, padded, padding.flop_waste, count, total_ns,
                                          table == "fallbacks", trace.string(module_sid), trace.frame(frame_id)))
    shapes.sort(key=lambda shape: -shape.total_ns)
    return ShapeData(shapes, target)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple if multiple > 0 else value


# -- 6 roofline ---------------------------------------------------------------------------------------


@dataclass
class ProgramPoint:
    program_id: int
    rank: int
    name: str | None
    kind: str | None
    n_ops: int | None
    dtype: str
    flops: float
    bytes_accessed: float
    executions: int
    total_ns: int
    mean_ns: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes_accessed if self.bytes_accessed else 0.0

    @property
    def achieved_flops(self) -> float:
        return self.flops / (self.mean_ns / 1e9) if self.mean_ns else 0.0


@dataclass
class RooflineData:
    programs: list[ProgramPoint]
    skipped: int
    platform: str | None
    target: Chip

    def estimated_flops(self, point: ProgramPoint) -> float:
        """FLOP/s on the target by its roofline (an estimate): min(peak for the dtype, intensity × HBM bandwidth)."""
        estimate_ns = self.target.roofline_ns(point.flops, point.bytes_accessed, point.dtype)
        return point.flops / (estimate_ns / 1e9) if estimate_ns else 0.0


def _program_dtype(signature: str | None) -> str:
    """The first floating-point input dtype of a program (bf16 when the signature names none)."""
    for spec in parse_specs(signature):
        if spec is not None and spec.dtype.startswith(("f", "bf")):
            return spec.dtype
    return "bf16"


def prepare_roofline(trace: Trace, target: Chip, *, max_points: int = MAX_SCATTER_POINTS) -> RooflineData:
    """Each executed program's XLA FLOPs and bytes with its measured mean execution time."""
    rows = trace.sql(
        "SELECT p.id, p.rank, p.name_sid, p.kind, p.n_ops, p.signature_sid, p.flops, p.bytes_accessed, "
        "COUNT(e.program_id), COALESCE(SUM(e.dur_ns), 0) AS total, AVG(e.dur_ns) FROM programs p "
        "JOIN executions e ON e.program_id = p.id AND e.rank = p.rank "
        "GROUP BY p.rank, p.id ORDER BY total DESC"
    )
    programs, skipped = [], 0
    for program_id, rank, name_sid, kind, n_ops, signature_sid, flops, bytes_accessed, executions, total_ns, mean_ns in rows:
        if not flops or not bytes_accessed or not mean_ns or len(programs) >= max_points:
            skipped += 1
            continue
        programs.append(ProgramPoint(program_id, rank, trace.string(name_sid), kind, n_ops,
                                     _program_dtype(trace.string(signature_sid)), float(flops), float(bytes_accessed),
                                     executions, total_ns, float(mean_ns)))
    return RooflineData(programs, skipped, trace.run.platform, target)


# -- 7 collectives ------------------------------------------------------------------------------------


@dataclass
class CollectivePoint:
    rank: int
    kind: str | None
    bytes: int
    dur_ns: int
    wait_ns: int
    bus_bandwidth: float | None
    step: int | None
    source: SourceLocation | None


@dataclass
class CollectiveData:
    points: list[CollectivePoint]
    total: int
    ranks: list[int]
    steps: list[int]
    wait_ns: list[list[int]]
    target: Chip

    @property
    def present(self) -> bool:
        return self.total > 0


def prepare_collectives(trace: Trace, target: Chip, *, max_points: int = MAX_SCATTER_POINTS) -> CollectiveData:
    """Message size against time per collective, and wait time per rank and step."""
    (total,) = trace.sql("SELECT COUNT(*) FROM collectives")[0]
    rows = trace.sql(
        "SELECT rank, kind, COALESCE(bytes, 0), COALESCE(dur_ns, 0) AS d, COALESCE(wait_ns, 0), bus_bandwidth, step, frame_id "
        f"FROM collectives ORDER BY d DESC LIMIT {int(max_points)}"
    )
    points = [CollectivePoint(rank, kind, size, dur, wait, bandwidth, step, trace.frame(frame_id))
              for rank, kind, size, dur, wait, bandwidth, step, frame_id in rows]
    waits = trace.sql("SELECT rank, COALESCE(step, 0), COALESCE(SUM(wait_ns), 0) FROM collectives GROUP BY rank, step")
    ranks = sorted({rank for rank, _, _ in waits})
    steps = sorted({step for _, step, _ in waits})
    grid = [[0] * len(steps) for _ in ranks]
    rank_index = {rank: index for index, rank in enumerate(ranks)}
    step_index = {step: index for index, step in enumerate(steps)}
    for rank, step, wait in waits:
        grid[rank_index[rank]][step_index[step]] = wait
    return CollectiveData(points, total, ranks, steps, grid, target)


# -- 8 memory -----------------------------------------------------------------------------------------


@dataclass
class MemorySeries:
    rank: int
    chip: int | None
    t_ns: list[int]
    live_bytes: list[int]
    peak_bytes: list[int]
    samples: int


@dataclass
class MemoryPeak:
    rank: int
    chip: int | None
    t_ns: int
    peak_bytes: int


@dataclass
class MemoryData:
    series: list[MemorySeries]
    peaks: list[MemoryPeak]
    target: Chip


def prepare_memory(trace: Trace, target: Chip, *, max_points: int = MEMORY_POINTS_PER_SERIES) -> MemoryData:
    """Live and peak bytes per rank and chip over time; long series keep each bin's lowest and highest sample."""
    offsets = rank_offsets(trace)
    series: list[MemorySeries] = []
    peaks: list[MemoryPeak] = []
    for rank, chip, samples in trace.sql("SELECT rank, chip, COUNT(*) FROM memory GROUP BY rank, chip ORDER BY rank, chip"):
        offset = offsets.get(rank, 0)
        where, params = "rank = ? AND chip IS ?", (rank, chip)
        if samples <= max_points:
            rows = trace.sql(f"SELECT t_ns, live_bytes, peak_bytes FROM memory WHERE {where} ORDER BY t_ns", params)
        else:
            first, last = trace.sql(f"SELECT MIN(t_ns), MAX(t_ns) FROM memory WHERE {where}", params)[0]
            bin_ns = max(1, -(-(last - first) // (max_points // 2)))
            rows = trace.sql(
                "SELECT t_ns, live_bytes, peak_bytes FROM ("
                "SELECT t_ns, live_bytes, peak_bytes, "
                "ROW_NUMBER() OVER (PARTITION BY (t_ns - ?) / ? ORDER BY live_bytes) AS low, "
                "ROW_NUMBER() OVER (PARTITION BY (t_ns - ?) / ? ORDER BY live_bytes DESC) AS high "
                f"FROM memory WHERE {where}) WHERE low = 1 OR high = 1 ORDER BY t_ns",
                (first, bin_ns, first, bin_ns, *params),
            )
        series.append(MemorySeries(rank, chip, [row[0] + offset for row in rows], [row[1] or 0 for row in rows],
                                   [row[2] or 0 for row in rows], samples))
        peak_row = trace.sql(
            f"SELECT t_ns, MAX(COALESCE(peak_bytes, live_bytes)) FROM memory WHERE {where}", params
        )[0]
        if peak_row[1] is not None:
            first_at_peak = trace.sql(
                f"SELECT MIN(t_ns) FROM memory WHERE {where} AND COALESCE(peak_bytes, live_bytes) = ?", (*params, peak_row[1])
            )[0][0]
            peaks.append(MemoryPeak(rank, chip, first_at_peak + offset, peak_row[1]))
    return MemoryData(series, peaks, target)

