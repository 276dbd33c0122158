"""Bit-for-bit sameness of two record columns, a whole column at a time (`reference_parity`'s rule).

Two values are the same when equal, NaN being the same as NaN, lists element
by element; an integral field (int or bool in the mode's records) compares as
Python's `int()` of each side. Columns of plain numbers, or of equal-length
lists of them, are compared as numpy arrays wherever that is exact: one shape
on both sides, ints against floats only below 2**53, finite values where
`int()` truncates. Every other column is compared value by value by the same
rule, so the answer never depends on which way it was computed.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

EXACT = 2.0 ** 53        # below it every int is a float64 exactly
NUMBERS = "biuf"


def plain(value):
    """A record value as Python sees it: numpy scalars and arrays become Python numbers and lists."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    return value.item() if hasattr(value, "item") else value


def same(a, b) -> bool:
    """The scalar rule: equal, NaN the same as NaN, lists and tuples element by element."""
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b) and all(
            same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _array(values: np.ndarray) -> np.ndarray | None:
    """The values as one array of numbers (a list per row becomes a row), None when they are anything else."""
    if values.dtype.kind in NUMBERS:
        return values
    if values.dtype.kind != "O":
        return None
    try:
        out = np.array(values.tolist())
    except (ValueError, TypeError, OverflowError):
        return None
    return out if out.dtype.kind in NUMBERS and len(out) == len(values) else None


def _exact_pair(a: np.ndarray | None, b: np.ndarray | None, integral: bool):
    """The two arrays as numpy compares them exactly under the rule, or None."""
    if a is None or b is None or a.shape != b.shape or (integral and a.ndim != 1):
        return None
    kinds = {a.dtype.kind, b.dtype.kind}
    if kinds <= set("bi") or (not integral and kinds in ({"u"}, {"f"})):
        return a, b
    # Through float64: exact for ints below 2**53; int() of a float is its truncation (NaN, inf: no answer).
    ints = [x for x in (a, b) if x.dtype.kind != "f" or integral]
    a, b = a.astype(np.float64), b.astype(np.float64)
    if not all((np.abs(x.astype(np.float64)) < EXACT).all() for x in ints):
        return None
    return (np.trunc(a), np.trunc(b)) if integral else (a, b)


def differs(mode: pd.Series, reference: pd.Series, rows: np.ndarray, integral: bool) -> np.ndarray:
    """For each of `rows` (positions in both columns): are the two values not the same?"""
    a, b = mode.to_numpy()[rows], reference.to_numpy()[rows]
    pair = _exact_pair(_array(a), _array(b), integral)
    if pair is None:
        return _differs_by_value(mode.iloc[rows], reference.iloc[rows], integral)
    a, b = pair
    equal = a == b
    if a.dtype.kind == "f" and b.dtype.kind == "f":
        equal |= np.isnan(a) & np.isnan(b)
    return ~equal.reshape(len(rows), -1).all(axis=1)


def _differs_by_value(mode: pd.Series, reference: pd.Series, integral: bool) -> np.ndarray:
    out = np.zeros(len(mode), dtype=bool)
    for i, (a, b) in enumerate(zip(mode, reference)):
        a, b = plain(a), plain(b)
        if integral:
            a, b = int(a), int(b)
        out[i] = not same(a, b)
    return out
