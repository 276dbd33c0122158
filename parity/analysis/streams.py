"""Two runs' emitted-token streams side by side, per request, in output order: where they part.

Each token frame is sorted once on (request, output index), stably; a
request's rows are then one slice of it, found by binary search, and columns
are read as numpy arrays once per frame. Nothing here touches a pandas row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

NO_LIMIT = 1 << 62       # the limit of a request whose streams never parted


class Ordered:
    """A token frame in (request, output index) order; its columns are read on demand, once each."""

    def __init__(self, frame: pd.DataFrame):
        self.frame = frame
        req = frame["req_id"].to_numpy()
        self.order = np.lexsort((frame["output_index"].to_numpy(), req))
        self.req = req[self.order]
        self._columns: dict[str, np.ndarray] = {}

    def column(self, name: str) -> np.ndarray:
        if name not in self._columns:
            self._columns[name] = self.frame[name].to_numpy()[self.order]
        return self._columns[name]

    def span(self, req_id) -> slice:
        """The rows of one request."""
        return slice(int(np.searchsorted(self.req, req_id, "left")), int(np.searchsorted(self.req, req_id, "right")))


@dataclass(frozen=True)
class Parting:
    """One request whose streams differ: its rows in both runs and the first emitted token that differs."""

    req_id: int
    index: int
    first: Ordered
    first_rows: slice
    second: Ordered
    second_rows: slice

    def firsts(self, column: str) -> np.ndarray:
        return self.first.column(column)[self.first_rows]

    def seconds(self, column: str) -> np.ndarray:
        return self.second.column(column)[self.second_rows]


def parted_streams(first: pd.DataFrame, second: pd.DataFrame) -> list[Parting]:
    """Every request of `first` whose token stream differs from `second`'s, in request order."""
    a, b = Ordered(first), Ordered(second)
    found = []
    for req_id in np.unique(a.req):
        rows_a, rows_b = a.span(req_id), b.span(req_id)
        ta, tb = a.column("token")[rows_a], b.column("token")[rows_b]
        n = min(len(ta), len(tb))
        differ = np.flatnonzero(ta[:n] != tb[:n])
        if differ.size or len(ta) != len(tb):
            found.append(Parting(int(req_id), int(differ[0]) if differ.size else n, a, rows_a, b, rows_b))
    return found


def stream_splits(eager: pd.DataFrame, other: pd.DataFrame) -> dict[int, dict]:
    """Per request whose tokens differ: the first differing emitted token, in both runs."""
    splits = {}
    for p in parted_streams(eager, other):
        length = p.first_rows.stop - p.first_rows.start
        at = min(p.index, length - 1)
        splits[p.req_id] = {"req_id": p.req_id, "output_index": p.index, "position": int(p.firsts("position")[at]),
                            "step": int(p.firsts("step")[at]),
                            "eager_gap": float(p.firsts("top2_gap")[at]) if p.index < length else None}
    return splits


def same_context(merged: pd.DataFrame, splits: dict) -> np.ndarray:
    """Which rows of a merge on (req_id, output_index) were emitted before their request's streams parted."""
    req = merged["req_id"].to_numpy()
    limit = np.full(len(req), NO_LIMIT, dtype=np.int64)
    if splits and len(req):
        keys = np.array(sorted(splits), dtype=np.int64)
        limits = np.array([splits[r]["output_index"] for r in keys.tolist()], dtype=np.int64)
        at = np.searchsorted(keys, req).clip(max=len(keys) - 1)
        limit = np.where(keys[at] == req, limits[at], limit)
    return merged["output_index"].to_numpy() < limit
