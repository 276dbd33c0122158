"""The shadow check of one replay: replay, run the callable eagerly on the same live inputs, compare.

Sequence (every storage the graph or the eager run writes is saved first, so
nothing the check does is visible afterwards):
1. replay the graph; keep its outputs and what it wrote;
2. put the written storages back; run the callable eagerly, under an undo
   log, on the live inputs (same objects, at the graph's padded shape: a
   smaller live tensor is seen through `shaped.py`) into fresh outputs; keep
   its outputs and writes; undo them;
3. with padded rows, a padded row that targets a real row's element in one
   indexed write of the eager run is PADDING_LEAK at once, no experiment run
   (`padded_writes.py`: on CUDA such writes race);
   else compare bitwise; on a mismatch, localise it with one-variable experiments;
4. with `num_valid` known, poison the padding and compare the real rows;
5. leave every storage as the real replay left it.
"""

from __future__ import annotations

import contextlib
import time

from parity.audit import pool
from parity.audit.cheap import Rebind, moved_names, reassigned
from parity.audit.infer import not_callable
from parity.audit.lab import ShadowLab, shadow
from parity.audit.localise import localise
from parity.audit.padded_writes import Recorder, overlaps, racing
from parity.audit.padding import padding_check
from parity.audit.shaped import at_graph_shape
from parity.audit.state import Result, Snapshot, clone_outputs, compare
from parity.graphs.host_state import moved_in, restore_in, short
from parity.graphs.roles import MISSING, resolve

# Diagnoses of a mismatch that name no role: the padding check may explain them.
UNPLACED = ("UNEXPLAINED", "CAPTURE_CONTEXT")


def cheap_reassigned(audit, found: list[Rebind]) -> dict | None:
    """BUFFER_REASSIGNED from addresses alone (no shadow run)."""
    culprits = reassigned(found)
    if not culprits:
        return None
    first = culprits[0]
    evidence = [r.describe() + ": no role reaches the captured storage any more, so nothing refreshes what the "
                "graph reads" for r in culprits]
    names = [name for r in culprits for name in moved_names(found, r.role.storage)]
    return audit._diagnosis("BUFFER_REASSIGNED", names,
                            captured_address=first.role.address, live_address=first.live_address,
                            evidence=evidence, experiment="address check at replay (no shadow run)")


def checked_replay(audit, roots: dict, args: tuple, kwargs: dict, found: list[Rebind]) -> list[dict]:
    """Replay with the shadow check; returns the diagnoses (empty when the replay is exact)."""
    record = audit.record
    started = time.perf_counter()
    # NOTE: host values too: the eager run below advances any counter the callable moves itself.
    pre = Snapshot(record.writes.values(), roots)
    audit._raw_replay()
    audit.backend.sync()
    replayed = Result(clone_outputs(record.outputs))
    # What the real replay left: the storages it writes, its outputs' and other graphs' live outputs'
    # (on the emulated backend these are the pool's segments: every byte a replay can write).
    left = Snapshot([*record.writes.values(), *record.outputs, *pool.live_outputs()])
    try:
        pool.after_replay(audit)
        pre.restore()
        num_valid, padded = audit.num_valid_now(), audit.padded_rows
        watch = Recorder(every=True) if num_valid is not None and padded and num_valid < padded else None
        # NOTE: the eager run reads what the replay reads: inputs and context at the graph's (padded) shape,
        # under the torch state the graph was captured in (default dtype and device, inference mode).
        with record.ambient.entered(), at_graph_shape(found, roots) as shaped:
            try:
                with watch or contextlib.nullcontext():
                    eager, log = shadow(record.fn, args, kwargs)
            except Exception as error:      # noqa: BLE001 - the user's callable: whatever it raises is a finding
                return [_eager_raised(audit, error, roots)]
            moved = moved_in(pre.host, roots)      # what the callable advanced itself, run eagerly
            restore_in(pre.host, roots)
            for ptr, (live, saved) in log.saved.items():
                pre.add_bytes(ptr, live, saved)
            replayed.writes = {ptr: left.saved[ptr][1] if ptr in left.saved else pre.saved[ptr][1]
                               for ptr in eager.writes}
            lab = ShadowLab(audit, roots, args, kwargs, pre, eager, moved, shaped, replayed)
            diagnoses = _judge(audit, lab, replayed, shaped, started,
                               overlaps(watch, num_valid, padded) if watch else [])
    finally:
        # NOTE: whatever happened, the program goes on from the state the real replay left.
        pre.restore()
        left.restore()
    pool.remember(audit, replayed.outputs)
    return diagnoses


def _eager_raised(audit, error: Exception, roots: dict) -> dict:
    """The callable, run eagerly on the inputs this replay stands for (at the graph's shape), raised: the graph
    replays a forward its own callable cannot run on them. Reported, never raised into the program, which goes on
    from what the replay left; what the graph was replayed for is named when a check saw it (`wrong_graph`,
    `smaller_than_the_batch`), not guessed here."""
    where = _raised_at(error)
    return audit._diagnosis("UNEXPLAINED", [], replays=0, evidence=[
        f"replay {audit.replays}: the callable run eagerly on this replay's inputs, at the graph's shape, raised "
        f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}" + (f" ({where})" if where
                                                                                              else ""),
        "the graph was replayed for inputs its own callable cannot take at the shape it was captured at: a graph "
        "looked up for another batch size or another forward would do this; no experiment can run on it"]
        + _host_moved(audit.record, roots), ruled_out=["the shadow comparison (the eager run did not complete)"])


def _host_moved(record, roots: dict) -> list[str]:
    """One line naming the host values the callable read at capture that hold another value now (the first 4)."""
    moved = [f"{path} ({short(captured)} at capture, {short(live)} now)" for path, captured in record.host.items()
             if (live := resolve(path, roots)) is not MISSING and type(live) is type(captured) and live != captured]
    return [f"host values the capture read that differ now: {', '.join(moved[:4])}"] if moved else []


def _raised_at(error: Exception) -> str | None:
    """file:line of the innermost frame of the program (not torch, not this package) the error passed through."""
    tb, found = error.__traceback__, None
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not not_callable(name):
            found = f"{name}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def _judge(audit, lab: ShadowLab, replayed: Result, found: list[Rebind], started: float, overlaps: list) -> list[dict]:
    diagnoses = []
    mismatch = compare(replayed, lab.eager, audit.record.output_names, layouts=lab.layouts,
                       defined=audit.record.defined)
    if mismatch is not None:
        audit.mismatches += 1
    if overlaps:
        return [_racing(audit, lab, overlaps, found, mismatch)]
    if mismatch is not None:
        # NOTE: in record mode a graph's first mismatch is localised; later ones only counted.
        if audit.mismatches == 1 or audit.on_mismatch == "raise":
            diagnoses.append(localise(lab, mismatch, started))
    elif (cheap := cheap_reassigned(audit, found)) is not None:
        diagnoses.append(cheap)
    num_valid, padded = audit.num_valid_now(), audit.padded_rows
    # NOTE: padding is judged on exact replays, and on a mismatch no experiment tied to one role: a broken
    # graph leaks in ways of its own, but padded rows writing where a live row writes race on CUDA (the
    # replay and eager then differ by chance): where no indexed write showed it (a custom kernel's write),
    # only the padding check can name that.
    unplaced = [d for d in diagnoses if d["kind"] in UNPLACED and not d["buffers"]]
    if (mismatch is None or unplaced) and num_valid is not None and padded is not None:
        leak = padding_check(lab, replayed, num_valid, padded, audit.padding)
        if leak is not None:
            evidence = leak.evidence + ([f"the replay also differs from eager ({mismatch.describe()}) and no "
                                         "one-variable experiment tied that to a role: padded rows that reach live "
                                         "rows explain it (where they write the same place, the order is "
                                         "undefined on CUDA)"] if unplaced else [])
            diagnoses = [d for d in diagnoses if d not in unplaced] + [audit._diagnosis(
                leak.kind, leak.buffers, rows=leak.rows, max_abs_diff=leak.max_abs_diff,
                captured_address=leak.captured_address, evidence=evidence, replays=lab.replays,
                experiment=leak.description)]
    return diagnoses


def _racing(audit, lab: ShadowLab, overlaps: list, found: list[Rebind], mismatch) -> dict:
    """PADDING_LEAK before any experiment: padded rows write, in one op, what real rows write."""
    num_valid, padded = audit.num_valid_now(), audit.padded_rows
    buffers, evidence = racing(overlaps, audit.record, found, num_valid, padded)
    if mismatch is not None:
        evidence.insert(0, f"replay {audit.replays}: {mismatch.describe()} between the graph and the callable run "
                           "eagerly")
    return audit._diagnosis("PADDING_LEAK", buffers, rows=mismatch.rows if mismatch else [],
                            max_abs_diff=mismatch.max_abs_diff if mismatch else None, evidence=evidence,
                            replays=lab.replays, experiment="read the indices of every indexed write of the eager "
                            "run: the targets of its padded rows against those of its real rows")
