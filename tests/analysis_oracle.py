"""The analysis as it was before issue 31 (per-request pandas loops), kept only as the oracle of its rewrite.

Verbatim copies of the slow functions at 586b304; `patched()` swaps them into
`parity.analysis.compare` so the whole `compare_runs` can be run the old way on
the same inputs. `identical` is the equality the rewrite is held to: same
types, same keys in the same order, floats equal to the bit (NaN equal NaN).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import struct

import pandas as pd

from parity.analysis import compare
from parity.analysis.draft_parity import DraftParity
from parity.analysis.numerics import Numerics
from parity.analysis.reference_parity import TABLES, ReferenceParity


def parted_streams(first: pd.DataFrame, second: pd.DataFrame):
    for req_id, rows in first.groupby("req_id"):
        a = rows.sort_values("output_index")
        b = second[second.req_id == req_id].sort_values("output_index")
        ta, tb = a["token"].tolist(), b["token"].tolist()
        if ta != tb:
            yield req_id, a, b, next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))


def stream_splits(eager: pd.DataFrame, other: pd.DataFrame) -> dict[int, dict]:
    splits = {}
    for req_id, a, _, i in parted_streams(eager, other):
        row = a.iloc[min(i, len(a) - 1)]
        splits[int(req_id)] = {"req_id": int(req_id), "output_index": i, "position": int(row["position"]),
                               "step": int(row["step"]), "eager_gap": float(row["top2_gap"]) if i < len(a) else None}
    return splits


def _chains(drafts: pd.DataFrame) -> dict[tuple[int, int], list[tuple]]:
    chains: dict = {}
    for (req_id, step), rows in drafts.groupby(["req_id", "step"], sort=False):
        rows = rows.sort_values("draft_index")
        key = (int(req_id), int(rows["position"].iloc[0]))
        chains[key] = list(zip(rows["draft_token"].tolist(), rows["draft_logprob"].tolist(),
                               rows["target_logprob"].tolist(), rows["draft_top2_gap"].tolist()))
    return chains


def draft_parity(reference: pd.DataFrame, run: pd.DataFrame, split_at: dict[int, int] | None = None) -> DraftParity:
    ref, other = _chains(reference), _chains(run)
    split_at = split_at or {}
    compared = 0
    worst, worst_verify, flips = 0.0, 0.0, []
    for key in sorted(ref.keys() & other.keys()):
        if key[1] > split_at.get(key[0], key[1]):
            continue
        for index, (a, b) in enumerate(zip(ref[key], other[key])):
            compared += 1
            worst_verify = max(worst_verify, abs(a[2] - b[2]))
            if a[0] != b[0]:
                flips.append({"req_id": key[0], "position": key[1] + index, "draft_index": index,
                              "eager_token": int(a[0]), "mode_token": int(b[0]), "eager_gap": float(a[3])})
                break
            worst = max(worst, abs(a[1] - b[1]))
    return DraftParity(compared, len(flips), worst, flips[0] if flips else None, worst_verify, tuple(flips))


def _same_context_logprob_diff(eager: pd.DataFrame, other: pd.DataFrame, splits: dict) -> float:
    merged = eager.merge(other, on=["req_id", "output_index"], suffixes=("_e", "_o"))
    limit = merged["req_id"].map(lambda r: splits[r]["output_index"] if r in splits else 1 << 62)
    merged = merged[merged["output_index"] < limit]
    return float((merged.logprob_e - merged.logprob_o).abs().max()) if len(merged) else 0.0


def numerics(reference_run, eager_run, name: str, bound: float) -> Numerics:
    splits = stream_splits(eager_run.tokens, reference_run.tokens)
    drafts = draft_parity(eager_run.drafts, reference_run.drafts,
                          {r: s["position"] for r, s in splits.items()})
    noise = max(_same_context_logprob_diff(eager_run.tokens, reference_run.tokens, splits),
                drafts.max_abs_verify_logprob_diff)
    flips = [{"kind": "token", "req_id": s["req_id"], "position": s["position"], "index": s["output_index"],
              "eager_gap": s["eager_gap"], "near_tie": s["eager_gap"] is not None and s["eager_gap"] <= bound}
             for s in splits.values()]
    flips += [{"kind": "draft", "req_id": f["req_id"], "position": f["position"], "index": f["draft_index"],
               "eager_gap": f["eager_gap"], "near_tie": f["eager_gap"] <= bound} for f in drafts.flips]
    flips.sort(key=lambda f: (f["req_id"], f["position"], f["kind"]))
    first = min(splits.values(), key=lambda s: (s["step"], s["req_id"])) if splits else None
    return Numerics(name, noise, drafts.max_abs_logprob_diff, len(splits), drafts.mismatches, drafts.compared,
                    sum(f["near_tie"] for f in flips), first, tuple(flips), bound)


def _divergences(ref: pd.DataFrame, other: pd.DataFrame, window: int = 6) -> list:
    found = []
    for req_id, ref_rows, mode_rows, first in parted_streams(ref, other):
        a, b = ref_rows["token"].tolist(), mode_rows["token"].tolist()
        lo = max(0, first - window)

        def step_at(rows, i):
            return int(rows["step"].iloc[i]) if i < len(rows) else -1

        pos = int(ref_rows["position"].iloc[first]) if first < len(ref_rows) else -1
        found.append(compare.Divergence(int(req_id), first, pos, step_at(ref_rows, first),
                                        step_at(mode_rows, first), a[lo:first + window], b[lo:first + window], lo))
    return found


def _logprob_deltas(ref: pd.DataFrame, other: pd.DataFrame, splits: dict) -> tuple[float, float, dict | None]:
    merged = ref.merge(other, on=["req_id", "output_index"], suffixes=("_ref", "_mode"))
    limit = merged["req_id"].map(lambda r: splits[r]["output_index"] if r in splits else 1 << 62)
    merged = merged[merged["output_index"] < limit]
    if merged.empty:
        return 0.0, 0.0, None
    delta = (merged.logprob_ref - merged.logprob_mode).abs().fillna(math.inf)
    at = merged.loc[delta.idxmax()]
    return float(delta.max()), float(delta.mean()), {
        "req_id": int(at.req_id), "output_index": int(at.output_index), "position": int(at.position_ref)}


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b) and all(
            _same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _plain(value):
    if hasattr(value, "tolist"):
        value = value.tolist()
    return value.item() if hasattr(value, "item") else value


def _differences(table: str, mode: pd.DataFrame, reference: pd.DataFrame) -> tuple[int, list[dict]]:
    keys, fields = TABLES[table]
    merged = mode.merge(reference, on=list(keys), how="outer", suffixes=("_mode", "_ref"), indicator="side")
    integral = {f for f in fields if pd.api.types.is_integer_dtype(mode[f]) or pd.api.types.is_bool_dtype(mode[f])}
    found = []
    for row in merged.itertuples(index=False):
        row = row._asdict()
        where = {k: int(row[k]) for k in keys}
        if row["side"] != "both":
            side = "reference" if row["side"] == "left_only" else "mode"
            found.append({"table": table, **where, "field": f"row missing in the {side} run",
                          "mode_value": None, "reference_value": None})
            continue
        for f in fields:
            a, b = _plain(row[f"{f}_mode"]), _plain(row[f"{f}_ref"])
            if f in integral:
                a, b = int(a), int(b)
            if not _same(a, b):
                found.append({"table": table, **where, "position": int(row["position_mode"]), "field": f,
                              "mode_value": a, "reference_value": b})
                break
    return len(merged), found


def reference_parity(run, reference, name: str) -> ReferenceParity:
    compared, found = 0, []
    for table in TABLES:
        n, diffs = _differences(table, getattr(run, table), getattr(reference, table))
        compared += n
        found += diffs
    first = min(found, key=lambda d: (d["step"], d["table"] != "tokens", d["req_id"],
                                      d.get("output_index", d.get("draft_index", 0)))) if found else None
    return ReferenceParity(name, not found, compared, len(found), first)


@contextlib.contextmanager
def patched():
    """`compare_runs` with the old functions in place of the new ones, for the length of the block."""
    old = {"_divergences": _divergences, "_logprob_deltas": _logprob_deltas, "stream_splits": stream_splits,
           "draft_parity": draft_parity, "reference_parity": reference_parity, "numerics": numerics}
    saved = {name: getattr(compare, name) for name in old}
    try:
        for name, fn in old.items():
            setattr(compare, name, fn)
        yield
    finally:
        for name, fn in saved.items():
            setattr(compare, name, fn)


def _bits(x: float) -> bytes:
    return b"nan" if math.isnan(x) else struct.pack("<d", x)


def identical(a, b, where: str = "") -> None:
    """Raise AssertionError naming the first place where `a` and `b` differ in value, type, order or bits."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__} ({a!r} vs {b!r})"
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            identical(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} vs {list(b)}"
        for k in a:
            identical(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            identical(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert _bits(a) == _bits(b), f"{where}: {a!r} vs {b!r}"
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"
