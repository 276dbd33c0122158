"""Which index buffer routes a padding leak: the audit's recorder of indexed ops, told the engine's live rows.

The rules are the audit's (`audit/padded_writes.py`: `overwrites`, padded rows
of one write targeting what a live row targets; `routed`, live rows read
through unchanged indices reading what differs between two runs); what is the
harness's own is how many of an index's rows are live: a registry buffer's
registered index kind (per token or per row) at the dispatched batch, and an
index computed in the forward whose length is the padded token or row count.
`Routes` hands them to the engine's padding probe (`engine.padding_routes`).
"""

from __future__ import annotations

from parity.audit import padded_writes
from parity.audit.padded_writes import Recorder
from parity.diagnosis.kinds import PADDING_LEAK
from parity.diagnosis.record import Diagnosis
from parity.engine.buffers import ROW, TOKEN
from parity.engine.padding_routes import labels


def live_rows(buffers, dispatch):
    """`live(index, rows)` as the audit's rules take it: how many leading entries of a `rows`-long index are live
    rows, from buffer `index` (its leading dimension must be the padded batch) or computed in the forward (its
    length the padded token or row count, not both with other live counts); None when not known."""
    def live(index: str | None, rows: int) -> int | None:
        if index is None:
            found = {n for padded, n in ((dispatch.num_tokens_padded, dispatch.num_tokens),
                                         (dispatch.num_reqs_padded, dispatch.num_reqs)) if padded == rows}
            return found.pop() if len(found) == 1 else None
        spec = buffers.spec(index)
        if spec.index not in (TOKEN, ROW) or rows != spec.padded(dispatch).stop:
            return None
        return spec.used(dispatch.num_tokens, dispatch.num_reqs).stop
    return live


def overwrites(recorder: Recorder, buffers, dispatch, persistent: dict[int, str]):
    """(buffers named, tensors written, evidence): `padded_writes.overwrites` over the registry's live rows."""
    return padded_writes.overwrites(recorder, live_rows(buffers, dispatch), persistent)


def routed(first: Recorder, second: Recorder, buffers, dispatch, persistent: dict[int, str]):
    """(index buffers, evidence): `padded_writes.routed` over the registry's live rows."""
    return padded_writes.routed(first, second, live_rows(buffers, dispatch), persistent)


def recorder_of(lab) -> Recorder:
    """A recorder of the indexed ops of the reference's divergent forward (hand it to one of its re-runs)."""
    owner = lab.ref.owner(lab.ev_r.owner)
    return Recorder({t.untyped_storage().data_ptr(): name for name, t in owner.buffers.items()})


def overwrite_diagnosis(lab, recorder: Recorder) -> Diagnosis | None:
    """PADDING_LEAK naming the index buffers whose padded rows write over live rows' elements in the reference's
    divergent forward, from `recorder` (one re-run of it from its pre-state); None when none does."""
    owner = lab.ref.owner(lab.ev_r.owner)
    names, _, evidence = overwrites(recorder, owner.buffers, lab.ev_r.dispatch, labels(owner))
    if not names:
        return None
    return lab.diagnosis(PADDING_LEAK, names, evidence=evidence, ruled_out=[],
                         experiment="the reference's forward re-run from its pre-state, its indexed writes read for "
                                    "the elements each batch row targets")


class Routes:
    """What the padding probe asks (`engine.padding_routes`): a recorder to run a forward under, and the rules."""

    recorder = staticmethod(Recorder)
    overwrites = staticmethod(overwrites)
    routed = staticmethod(routed)
