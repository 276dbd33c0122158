"""Snapshots, results and bitwise comparison: the ground every experiment stands on.

A `Result` is what one run of the callable produced: its output tensors and the
final bytes of every external storage it wrote. Two results are compared
bitwise (NaN bits included), and a mismatch says which output, which rows
and how large the largest difference is. `Snapshot` saves storages' bytes and
puts them back, so each experiment starts from the state the replay started
from, and the audited program continues from the state the real replay left.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from parity.audit.trace import storage_bytes, storage_ptr
from parity.graphs.host_state import restore_in, values_of


@dataclass
class Result:
    outputs: list[torch.Tensor]                                  # clones, in output order
    writes: dict[int, torch.Tensor] = field(default_factory=dict)   # storage -> its bytes after the run


@dataclass
class Mismatch:
    name: str
    rows: list[int]
    max_abs_diff: float | None
    names: list[str]                # every output that differs

    def describe(self) -> str:
        where = f" rows {self.rows[:8]}" if self.rows else ""
        size = f", max |diff| {self.max_abs_diff:.3g}" if self.max_abs_diff is not None else ""
        return f"{self.name}{where} differ{size}"


def clone_outputs(tensors) -> list[torch.Tensor]:
    """Copies of the tensors as they are now."""
    return [t.detach().clone() for t in tensors]


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (same shape, dtype and bytes; a NaN equals the same NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def rows_apart(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    """The rows (along the leading dimension) whose bytes differ; none when the shapes or dtypes differ."""
    if a.shape != b.shape or a.dtype != b.dtype or a.dim() == 0:
        return []
    x = a.reshape(a.shape[0], -1).contiguous().view(torch.uint8) if a.numel() else a
    y = b.reshape(b.shape[0], -1).contiguous().view(torch.uint8) if b.numel() else b
    return [int(i) for i in (x != y).any(dim=1).nonzero().flatten().tolist()]


def delta(x: torch.Tensor, y: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """|x - y| elementwise in `dtype`, where a NaN or an infinity on one side only is an infinite difference and
    a NaN on both sides none: a graph-only NaN is a divergence, not a match."""
    x, y = x.to(dtype), y.to(dtype)
    out = (x - y).abs()
    same = (x == y) | (x.isnan() & y.isnan())
    return torch.where(same, torch.zeros_like(out), torch.where(out.isnan(), float("inf"), out))


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float | None:
    if a.shape != b.shape or not (a.is_floating_point() or a.dtype in (torch.int32, torch.int64)):
        return None
    return float(delta(a, b, torch.float64).max()) if a.numel() else 0.0   # float64: int64 values stay exact


def _as_layout(raw: torch.Tensor | None, layout) -> torch.Tensor | None:
    if raw is None or layout is None or layout[1] is None:
        return raw
    return raw.view(layout[1]).view(layout[2])


def _defined(g: torch.Tensor, e: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The elements the graph defines, rows kept: undefined ones read as zero bytes on both sides."""
    if mask is None or g.shape != e.shape or mask.shape != g.shape:
        return g, e
    return g.masked_fill(~mask, 0), e.masked_fill(~mask, 0)


def compare(graph: Result, eager: Result, names: list[str], rows: int | None = None,
            padded: int | None = None, layouts: dict | None = None, defined: list | None = None) -> Mismatch | None:
    """The first difference between two results.

    With `rows`, outputs whose leading dimension is `padded` are compared on
    their first `rows` rows only (the real rows of a padded batch). `layouts`
    maps a written storage to (name, dtype, shape) to compare it as a tensor.
    `defined` gives, per output, the elements the graph writes (a bool mask;
    None: all): memory the callable only allocated is not compared.
    """
    differing, first = [], None
    if len(graph.outputs) != len(eager.outputs):
        return Mismatch("number of outputs", [], None, ["outputs"])
    masks = list(defined or []) + [None] * len(graph.outputs)
    pairs = [(n, *_defined(g, e, m)) for n, g, e, m in zip(names, graph.outputs, eager.outputs, masks)]
    layouts = layouts or {}
    for ptr in eager.writes:
        layout = layouts.get(ptr)
        name = layout[0] if layout else f"written storage 0x{ptr:x}"
        pairs.append((name, _as_layout(graph.writes.get(ptr), layout), _as_layout(eager.writes[ptr], layout)))
    for name, g, e in pairs:
        if g is None:
            continue
        if rows is not None and g.dim() and g.shape == e.shape and g.shape[0] == padded:
            g, e = g[:rows], e[:rows]
        if not bit_equal(g, e):
            differing.append(name)
            if first is None:
                first = Mismatch(name, rows_apart(g, e), _max_abs(g, e), differing)
    return first


class Snapshot:
    """The bytes of a set of storages, to put back later; with `roots`, the host values they reach too."""

    def __init__(self, tensors=(), roots: dict | None = None):
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for t in tensors:
            self.add(t)
        self.roots = roots
        self.host = values_of(roots) if roots is not None else {}

    def add(self, t: torch.Tensor) -> None:
        ptr = storage_ptr(t)
        if ptr not in self.saved:
            live = storage_bytes(t)
            self.saved[ptr] = (live, live.clone())

    def before(self, t: torch.Tensor) -> torch.Tensor:
        """`t` as it was when saved (a view of the saved bytes, in its layout); `t` itself when not saved."""
        saved = self.saved.get(storage_ptr(t))
        if saved is None:
            return t
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(saved[1].untyped_storage(), t.storage_offset(),
                                                                    t.shape, t.stride())

    def add_bytes(self, ptr: int, live: torch.Tensor, saved: torch.Tensor) -> None:
        self.saved.setdefault(ptr, (live, saved))

    def restore(self) -> None:
        for live, saved in self.saved.values():
            live.copy_(saved)
        if self.roots is not None:
            restore_in(self.host, self.roots)
