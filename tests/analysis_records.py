"""Small hand-made run records for the analysis' equality tests, and the edits that make runs part.

`records(lengths, k, seed)` builds one run's tokens and drafts with the
engine's columns and dtypes (records.py): a request emits 1 to k+1 tokens a
step and drafts k tokens each step after its first. `edited(result, edits)`
applies edits, each a tuple naming what to do to which request, to a copy:
streams that part or end early or late, drafts that flip, logprobs one ulp off or NaN, rows
missing, steps shifted, a proposal repeated at the same position, lists
stored as numpy arrays (as parquet gives them back) or of unequal lengths, tokens
stored as floats.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd

from parity.analysis.yardstick import Yardstick
from parity.engine.records import DRAFT_COLUMNS, TOKEN_COLUMNS

BOUND = Yardstick("bfloat16").bound
EDITS = ("part", "truncate", "extend", "nudge", "nan", "flip_draft", "shift_steps", "drop_draft", "top5", "accepted",
         "negative_zero", "repeat_proposal", "arrays", "float_tokens", "ragged")


@dataclasses.dataclass
class Result:
    tokens: pd.DataFrame
    drafts: pd.DataFrame


def _gap(rng) -> float:
    # near ties on either side of the bound, and the bound itself
    return float(rng.choice([BOUND, math.nextafter(BOUND, 1.0), BOUND / 2, 2 * BOUND, rng.uniform(0, 3)]))


def records(lengths: list[int], k: int, seed: int) -> Result:
    rng = np.random.default_rng(seed)
    tokens, drafts = [], []
    for req_id, length in enumerate(lengths):
        step, index, prompt = int(rng.integers(0, 3)), 0, int(rng.integers(2, 6))
        while index < length:
            emit = 1 if index == 0 else min(length - index, int(rng.integers(1, k + 2)))
            base = prompt + index
            if index:
                accepted = emit - 1
                for j in range(k):
                    lps = sorted(rng.uniform(-4, 0, 5).tolist(), reverse=True)
                    drafts.append((step, req_id, j, base + j, int(rng.integers(0, 50)), float(rng.uniform(-3, 0)),
                                   _gap(rng), int(rng.integers(0, 50)), lps[0],
                                   rng.integers(0, 50, 5).tolist(), lps, j < accepted, accepted))
            for j in range(emit):
                tokens.append((req_id, step, index + j, base + j, int(rng.integers(0, 50)),
                               float(rng.uniform(-3, 0)), _gap(rng)))
            index, step = index + emit, step + 1
    return Result(pd.DataFrame(tokens, columns=TOKEN_COLUMNS), pd.DataFrame(drafts, columns=DRAFT_COLUMNS))


def _pick(frame: pd.DataFrame, req: int, at: int):
    """The rows of request `req` from its `at`-th emitted token on (modulo its length), and that token's row."""
    rows = frame[frame.req_id == req].sort_values("output_index")
    if rows.empty:
        return None, None
    first = rows.iloc[at % len(rows)]
    return rows.index[rows.output_index >= first.output_index], first


def _edit(t: pd.DataFrame, d: pd.DataFrame, edit: tuple) -> tuple[pd.DataFrame, pd.DataFrame]:
    kind, req, at = edit
    later, first = _pick(t, req, at)
    if first is None:
        return t, d
    drafts_later = d.index[(d.req_id == req) & (d.position >= first.position)]
    some = d.index[d.req_id == req][:1]
    if kind == "part":
        t.loc[later, "token"] += 1
        d.loc[drafts_later, "draft_token"] += 1
    elif kind == "truncate":
        t = t.drop(later)
    elif kind == "extend":      # one token more than the other run emitted
        last = t.loc[[t.loc[later, "output_index"].idxmax()]].copy()
        last[["output_index", "position", "step"]] += 1
        last["token"] += 5
        t = pd.concat([t, last], ignore_index=True)
    elif kind == "nudge":
        t.loc[later[:1], "logprob"] = t.loc[later[:1], "logprob"].map(lambda x: math.nextafter(x, 0.0))
        d.loc[some, "target_logprob"] = d.loc[some, "target_logprob"].map(lambda x: math.nextafter(x, 0.0))
    elif kind == "nan":
        t.loc[later[:1], "logprob"] = math.nan
        d.loc[some, "draft_logprob"] = math.nan
    elif kind == "flip_draft":
        d.loc[drafts_later[:1], "draft_token"] += 7
    elif kind == "shift_steps":
        t.loc[later, "step"] += 1
        d.loc[drafts_later, "step"] += 1
    elif kind == "drop_draft":
        d = d.drop(drafts_later[:1])
    elif kind == "top5":
        d["top5_logprobs"] = [list(v[:4]) + [v[4] - 1.0] if i in set(drafts_later[:2]) else v
                              for i, v in zip(d.index, d.top5_logprobs)]
    elif kind == "accepted":
        d.loc[drafts_later[:1], "accepted"] = ~d.loc[drafts_later[:1], "accepted"]
    elif kind == "negative_zero":
        t.loc[later[:1], "logprob"] = 0.0 if at % 2 else -0.0
    elif kind == "repeat_proposal":     # the same (request, position of draft 0) drafted again in a later step
        again = d[d.step == d.loc[drafts_later[:1], "step"].max()].copy() if len(drafts_later) else d.iloc[:0]
        again["step"] += 1000
        again["draft_token"] += 3
        d = pd.concat([d, again], ignore_index=True)
    elif kind == "arrays":
        d["top5_tokens"] = [np.asarray(v) for v in d.top5_tokens]
    elif kind == "ragged":      # one list shorter than the others: no array holds the column
        d["top5_logprobs"] = [v[:3] if i in set(drafts_later[:1]) else v for i, v in zip(d.index, d.top5_logprobs)]
    elif kind == "float_tokens":
        t["token"] = t["token"].astype(float)
    return t, d


def edited(result: Result, edits) -> Result:
    t, d = result.tokens.copy(), result.drafts.copy()
    d["top5_tokens"] = [list(v) for v in d.top5_tokens]
    d["top5_logprobs"] = [list(v) for v in d.top5_logprobs]
    for edit in edits:
        t, d = _edit(t, d, edit)
    return Result(t.reset_index(drop=True), d.reset_index(drop=True))


def runset(eager: Result, references: dict, modes: dict, k: int):
    """What `compare_runs` reads: `modes` maps a graph mode to (its reference's name, its result)."""
    run = lambda result: SimpleNamespace(result=result, graph_replays=1, padding_probe=None)   # noqa: E731
    scenario = SimpleNamespace(num_speculative_tokens=k,
                               tolerances=SimpleNamespace(alpha=0.01, acceptance_min_effect=0.05))
    return SimpleNamespace(runs={"eager": run(eager), **{m: run(r) for m, (_, r) in modes.items()}},
                           references={n: run(r) for n, r in references.items()},
                           reference_of={m: n for m, (n, _) in modes.items()},
                           yardstick=Yardstick("bfloat16")), scenario
