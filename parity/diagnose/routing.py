"""Which index buffer routes a padding leak, told from the indexed reads and writes of one forward.

A padded row reaches a live one through an index: an indexed write whose
padded rows name an element a live row writes, or an indexed read whose live
rows name an element that is not theirs. The buffer to name is the one that
supplied those indices (a registry buffer, found by storage), not the tensor
written or read: the slots are right, the index routed the row to the wrong
one. Each index element's batch row is its position along the index's leading
dimension, as the buffer's registered index kind (per token or per row) says.

- `overwrites`: in one write, padded rows target an element a live row
  targets. Told from the indices alone, so a registry that declares a wrong pad
  value cannot hide it, and on CUDA (where which of two writes to one element
  lands is undefined) it gives the emulated backend's answer.
- `routed`: two runs of one forward that differ only in a poisoned region of
  persistent slots (KV, recurrent states); a read whose live rows' index
  entries are the same in both, yet whose live rows read different values,
  routed those rows to poisoned elements.

Ops read: writes as `parity.audit.padded_writes` reads them; reads
`index_select`, `gather` and advanced indexing with a leading index. A write
whose index is computed inside the forward (not a view of a registry buffer)
has no buffer to blame for its routing: when its padded rows overwrite live
rows' elements of a registry buffer, that buffer is named (where the padded
rows' values land, by PADDING_LEAK's definition); its batch rows are known when
its length is the padded token or row count. Such a read is not named.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.audit.padded_writes import _along, _index_put, _scatter, overlap, targets
from parity.diagnosis.kinds import PADDING_LEAK
from parity.diagnosis.record import Diagnosis
from parity.engine.buffers import ROW, TOKEN
from parity.engine.padding_regions import bits
from parity.engine.padding_routes import labels
from parity.graphs.compiled import RegionAware, in_region

aten = torch.ops.aten
READS = (aten.index_select.default, aten.gather.default, aten.index.Tensor)


@dataclass
class Access:
    op: str
    write: bool
    tensor: int                      # storage of the tensor written or read
    index: str | None                # the registry buffer that supplied the index (None: computed in the forward)
    flat: torch.Tensor               # each index element's target; leading dimension = batch row
    values: torch.Tensor | None      # a read's values, leading dimension = batch row


class Recorder(RegionAware):
    """Over a forward: every indexed read and write whose index is a view of a registry buffer."""

    def __init__(self, names: dict[int, str]):
        super().__init__()
        self.names = names           # storage -> registry buffer name
        self.accesses: list[Access] = []

    def _name(self, indices) -> str | None:
        return next((self.names[i.untyped_storage().data_ptr()] for i in indices if isinstance(i, torch.Tensor)
                     and i.untyped_storage().data_ptr() in self.names), None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        found = None if in_region() else targets(func, args, kwargs)
        write = None
        if found is not None and found[2] is not None:
            storage = found[0].untyped_storage().data_ptr()
            index = self._name(found[1])
            # NOTE: an index computed in the forward is kept where it writes a registry buffer (named then).
            if index is not None or storage in self.names:
                write = Access(str(func), True, storage, index, found[2], None)
        out = func(*args, **kwargs)
        if write is not None:
            self.accesses.append(write)
        elif func in READS and not in_region():
            read = self._read(func, args, out)
            if read is not None:
                self.accesses.append(read)
        return out

    def _read(self, func, args, out) -> Access | None:
        source = args[0]
        if func is aten.index.Tensor:
            indices, flat, values = list(args[1]), _index_put(source, list(args[1])), out
        else:
            dim = args[1] % max(source.dim(), 1)
            along = func is aten.index_select.default
            indices = [args[2]]
            flat = _along(source, dim, args[2]) if along else _scatter(source, dim, args[2])
            values = out.movedim(dim, 0) if along else out
        name = self._name(indices) if flat is not None and flat.dim() else None
        if name is None:
            return None
        return Access(str(func), False, source.untyped_storage().data_ptr(), name, flat, values.detach().clone())


def live_rows(buffers, name: str, dispatch, rows: int) -> int | None:
    """How many leading entries of a `rows`-long index from buffer `name` are live rows; None when its leading
    dimension is not the padded batch (then its batch rows are not known)."""
    spec = buffers.spec(name)
    if spec.index not in (TOKEN, ROW) or rows != spec.padded(dispatch).stop:
        return None
    return spec.used(dispatch.num_tokens, dispatch.num_reqs).stop


def computed_live_rows(dispatch, rows: int) -> int | None:
    """How many leading entries of a `rows`-long index computed in the forward are live rows: its length is the
    padded token count or the padded row count (None when it is neither, or both with other live counts)."""
    live = {n for padded, n in ((dispatch.num_tokens_padded, dispatch.num_tokens),
                                (dispatch.num_reqs_padded, dispatch.num_reqs)) if padded == rows}
    return live.pop() if len(live) == 1 else None


def overwrites(recorder: Recorder, buffers, dispatch, persistent: dict[int, str]) -> tuple[list[str], list[str],
                                                                                      list[str]]:
    """(buffers named, tensors written, evidence) of every write whose padded rows target an element a live row
    targets: its index buffer, or, for an index computed in the forward, the registry buffer it writes."""
    names, written, evidence = [], [], []
    for a in (a for a in recorder.accesses if a.write):
        padded = a.flat.shape[0]
        valid = (live_rows(buffers, a.index, dispatch, padded) if a.index is not None
                 else computed_live_rows(dispatch, padded))
        hit = overlap(a.flat, valid, padded) if valid is not None and valid < padded else None
        if hit is None:
            continue
        label = persistent.get(a.tensor) or recorder.names.get(a.tensor, "a tensor")
        name = a.index if a.index is not None else label
        names += [name] if name not in names else []
        written += [label] if label not in written else []
        route = f"of {a.index}" if a.index is not None else "of an index computed in the forward"
        evidence.append(f"{a.op} writing {label}: the padded rows {valid}..{padded - 1} "
                        f"{route} target {hit[0]} element(s) a live row of the same write targets (element "
                        f"{hit[1]}): padded rows write over live rows, whatever pad value the registry declares")
    if names:
        evidence.append("told from the write's indices alone, before any re-run: on CUDA which of two writes to one "
                        "element lands is undefined, so the answer is the same on every backend")
    return names, written, evidence


def routed(first: Recorder, second: Recorder, buffers, dispatch, persistent: dict[int, str]) -> tuple[list[str], list[str]]:
    """(index buffers, evidence) of the reads of persistent tensors (`persistent`: storage -> name) whose live rows' index entries are
    the same in two runs of one forward yet read different values: the index routed them to what differs."""
    names, evidence = [], []
    reads = zip(*[[a for a in r.accesses if not a.write] for r in (first, second)])
    for a, b in reads:
        if (a.op, a.index, a.tensor) != (b.op, b.index, b.tensor) or a.tensor not in persistent:
            continue
        valid = live_rows(buffers, a.index, dispatch, a.flat.shape[0])
        if not valid or not torch.equal(a.flat[:valid], b.flat[:valid]):
            continue    # an index that itself moved is named by its own region
        moved = (bits(a.values[:valid]) != bits(b.values[:valid])).reshape(valid, -1).any(dim=1)
        rows = moved.nonzero().flatten().tolist()
        if not rows or a.index in names:
            continue
        names.append(a.index)
        shown = ", ".join(f"row {r} -> element {int(a.flat[r].reshape(-1)[0])}" for r in rows[:4])
        evidence.append(f"{a.op} reading {persistent[a.tensor]} through {a.index}: live rows read elements that differ "
                        f"between the two runs though {a.index}'s live entries are the same ({shown}): {a.index} "
                        f"routes live rows to poisoned elements")
    return names, evidence


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
