"""Bit-for-bit parity of a graph mode with its strict padded reference: the correctness verdict.

A graph replays the very kernels its padded reference runs eagerly at the same
padded shapes, on the same schedule, so every record must be equal to the
last bit: emitted tokens and their target logprobs, draft tokens and draft
logprobs, the verify rows' target logprobs. One differing bit is a graph bug.
Rows are aligned on their keys; a row present on one side only (the schedules
parted after a difference) is a difference too. The first difference is the
earliest in engine steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from parity.analysis.same_values import differs, plain, same

# table -> (keys that align rows, fields compared bit for bit)
TABLES = {
    "tokens": (("step", "req_id", "output_index"), ("position", "token", "logprob", "top2_gap")),
    "drafts": (("step", "req_id", "draft_index"),
               ("position", "draft_token", "draft_logprob", "draft_top2_gap", "target_token", "target_logprob",
                "top5_tokens", "top5_logprobs", "accepted", "num_accepted")),
}


@dataclass(frozen=True)
class ReferenceParity:
    reference: str                # the reference run's name
    bitwise_equal: bool
    rows_compared: int
    rows_differing: int
    first_difference: dict | None

    def as_dict(self) -> dict:
        return {"name": self.reference, "bitwise_equal": self.bitwise_equal, "rows_compared": self.rows_compared,
                "rows_differing": self.rows_differing, "first_difference": self.first_difference}


def _differences(table: str, mode: pd.DataFrame, reference: pd.DataFrame) -> tuple[int, int, dict | None]:
    """Rows compared, rows differing and the earliest difference (in engine steps) of one table."""
    keys, fields = TABLES[table]
    merged = mode.merge(reference, on=list(keys), how="outer", suffixes=("_mode", "_ref"), indicator="side")
    integral = {f for f in fields if pd.api.types.is_integer_dtype(mode[f]) or pd.api.types.is_bool_dtype(mode[f])}
    differing = (merged["side"] != "both").to_numpy(copy=True)
    pending = np.flatnonzero(~differing)
    for f in fields:            # a row's first differing field ends its comparison
        if not len(pending):
            break
        bad = differs(merged[f"{f}_mode"], merged[f"{f}_ref"], pending, f in integral)
        differing[pending[bad]] = True
        pending = pending[~bad]
    rows = np.flatnonzero(differing)
    if not len(rows):
        return len(merged), 0, None
    # the earliest by (step, request, index), the first in merged order among equals
    step, req, index = (merged[k].to_numpy()[rows].astype(np.int64) for k in keys)
    earliest = rows[np.lexsort((index, req, step))[0]]
    return len(merged), len(rows), _difference(table, merged.iloc[[earliest]], integral)


def _difference(table: str, row: pd.DataFrame, integral: set) -> dict:
    """What differs in one row of the outer merge: a side missing, or its first differing field."""
    keys, fields = TABLES[table]
    row = next(row.itertuples(index=False))._asdict()
    where = {k: int(row[k]) for k in keys}
    if row["side"] != "both":
        side = "reference" if row["side"] == "left_only" else "mode"
        return {"table": table, **where, "field": f"row missing in the {side} run",
                "mode_value": None, "reference_value": None}
    for f in fields:
        a, b = plain(row[f"{f}_mode"]), plain(row[f"{f}_ref"])
        if f in integral:   # an outer merge turns integer columns into floats
            a, b = int(a), int(b)
        if not same(a, b):
            return {"table": table, **where, "position": int(row["position_mode"]), "field": f,
                    "mode_value": a, "reference_value": b}
    raise AssertionError(f"{table} row {where} was found to differ but no field differs")


def reference_parity(run, reference, name: str) -> ReferenceParity:
    """Compare two RunResults record by record, bit for bit."""
    compared, differing, found = 0, 0, []
    for table in TABLES:
        n, d, first = _differences(table, getattr(run, table), getattr(reference, table))
        compared, differing = compared + n, differing + d
        found += [first] if first else []
    first = min(found, key=lambda d: (d["step"], d["table"] != "tokens", d["req_id"],
                                      d.get("output_index", d.get("draft_index", 0)))) if found else None
    return ReferenceParity(name, not differing, compared, differing, first)


def describe(d: dict) -> str:
    """One line naming a first difference."""
    index = (f"output token {d['output_index']}" if "output_index" in d else f"draft {d['draft_index']}")
    where = f"step {d['step']}, request {d['req_id']}, {index}"
    if d["mode_value"] is None and d["reference_value"] is None:
        return f"{where}: {d['field']}"
    return f"{where}: {d['field']} {d['mode_value']!r} vs {d['reference_value']!r} in the reference"
