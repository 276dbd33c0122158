"""PADDING_LEAK through what padded rows store: poison the values each indexed write stores for them.

Input poisoning (`padding.py`) leaves an integer input alone when its padded
entries hold one value no real entry holds: that is how engines mark padding
(slot -1, a trash row, a zero length), and any other value would make a
correct kernel act on a padded row. But the marker can itself be the bug: a
pad slot 0 that is request 0's first KV slot holds a value no real entry of
this step holds, yet padded rows then write request 0's cache, in the graph
and in eager at the same padded shape alike. Nothing poisoned reaches there.

So the forward is run eagerly once more with every indexed write whose index
has the padded batch as leading dimension storing, for its padded rows,
copies of its real rows' values (finite, so a masked read multiplies them by
exact zeros). A correct forward's real rows never read what padded rows
store; when its real outputs change, they do. Then:
- the writes to blame: the fewest whose poisoning alone still changes real
  rows (delta debugging over the writes, in order);
- the inputs to name: each per-step integer input poisoned alone (copies of
  its real entries, pad markers included), the blamed writes' padded rows
  move to other elements when it decides where they go.
Ops poisoned: `index_copy_`, `index_put_`, `scatter_` (src) and `put_`, with
the same reach as `padded_writes.py` (no compiled regions, no custom kernels).
An eager re-run that does not reproduce itself claims nothing.
"""

from __future__ import annotations

import torch

from parity.audit.delta_debug import ddmin
from parity.audit.experiments import Experiment
from parity.audit.lab import ShadowLab, shadow
from parity.audit.padded_writes import Recorder
from parity.audit.record import Role
from parity.audit.state import Result, Snapshot, compare
from parity.graphs.compiled import in_region

aten = torch.ops.aten


def fill_from_real(rows: torch.Tensor, num_valid: int) -> None:
    """Rows `num_valid..` of `rows` (leading dimension = batch row) set to its real rows', shuffled."""
    holes = rows.shape[0] - num_valid
    if holes > 0 and num_valid > 0:
        picks = (torch.arange(holes, device=rows.device) * 7 + 1) % num_valid
        rows[num_valid:] = rows[:num_valid][picks]


class StorePoisoner(Recorder):
    """Records every indexed write; stores copies of real rows' values for the padded rows of the padded writes
    whose ordinals are in `poison` (ordinals count the writes whose index leads with the padded batch)."""

    def __init__(self, num_valid: int, padded: int, poison: set[int] | None = None):
        super().__init__(every=True)
        self.num_valid, self.padded, self.poison = num_valid, padded, poison or set()
        self.padded_writes: list[int] = []      # positions in `accesses` of the writes led by the padded batch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = len(self.accesses)
        if not in_region() and not kwargs:
            try:
                args = self._poisoned(func, args, len(self.padded_writes))
            except RuntimeError:        # values that do not lay out as the index says: left as they are
                pass
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if len(self.accesses) > before and self.accesses[-1].write and self._led(self.accesses[-1].flat):
            self.padded_writes.append(len(self.accesses) - 1)
        return out

    def _led(self, flat) -> bool:
        return flat is not None and flat.dim() > 0 and flat.shape[0] == self.padded

    def _poisoned(self, func, args, ordinal: int):
        if ordinal not in self.poison:
            return args
        args, n = list(args), self.num_valid
        if func is aten.index_copy_.default and args[2].dim() == 1 and args[2].shape[0] == self.padded:
            source = args[3].clone()
            fill_from_real(source.movedim(args[1] % max(source.dim(), 1), 0), n)
            args[3] = source
        elif func in (aten.index_put_.default, aten._index_put_impl_.default):
            indices = list(args[1])
            if indices and all(i is not None for i in indices) and not any(i.dtype == torch.bool for i in indices):
                shape = torch.broadcast_shapes(*[i.shape for i in indices])
                if shape and shape[0] == self.padded:
                    values = args[2].expand(*shape, *args[0].shape[len(indices):]).clone()
                    fill_from_real(values, n)
                    args[2] = values
        elif func is aten.scatter_.src and args[2].dim() and args[2].shape[0] == self.padded:
            source = args[3].clone()
            fill_from_real(source[:self.padded], n)
            args[3] = source
        elif func is aten.put_.default and args[1].dim() and args[1].shape[0] == self.padded:
            source = args[2].clone().reshape(args[1].shape)
            fill_from_real(source, n)
            args[2] = source.reshape(-1)
        return tuple(args)


def _eager(lab: ShadowLab, num_valid: int, padded: int, poison: set[int] | None = None, change=None
           ) -> tuple[Result, StorePoisoner]:
    """The callable run eagerly from the pre-replay state (after `change()`) under a `StorePoisoner`; its outputs
    (its writes undone)."""
    lab.pre.restore()
    if change is not None:
        change()
    poisoner = StorePoisoner(num_valid, padded, poison)
    with poisoner:
        result, _ = shadow(lab.record.fn, lab.args, lab.kwargs)
    return Result(result.outputs), poisoner


def stored_leak(lab: ShadowLab, roles: list[Role], num_valid: int, padded: int, leaking: tuple | None = None
                ) -> Experiment | None:
    """PADDING_LEAK when real rows read what the forward's indexed writes store for padded rows; else None.
    `roles`: the per-step inputs with padded rows (`padding.padding_roles`); `leaking`: None when poisoning them
    moved no real row, else the names of those whose poisoned padding alone did (`padding.py`): of the inputs
    that decide where the stores go, those are named (a cache row index, not the position within the row)."""
    names = lab.record.output_names
    reference = Result(lab.eager.outputs)
    clean, recorded = _eager(lab, num_valid, padded)
    writes = list(range(len(recorded.padded_writes)))
    if not writes or compare(clean, reference, names, rows=num_valid, padded=padded) is not None:
        return None                                 # nothing stored for padded rows, or eager does not reproduce

    seen: dict[tuple, object] = {}

    def mismatch(subset):
        key = tuple(subset)
        if key not in seen:
            seen[key] = compare(_eager(lab, num_valid, padded, set(subset))[0], reference, names, rows=num_valid,
                                padded=padded)
        return seen[key]
    if mismatch(writes) is None:
        return None
    blamed = ddmin(writes, lambda subset: mismatch(subset) is not None)
    leak = mismatch(blamed)
    accesses = [recorded.accesses[recorded.padded_writes[k]] for k in blamed]
    deciding = [r for r in roles if not (r.tensor.is_floating_point() or r.tensor.is_complex())
                and _moves(lab, r, num_valid, padded, blamed, accesses)]
    layouts = lab.record.layouts
    written = [layouts.get(a.storage, (f"a {tuple(a.tensor.shape)} tensor",))[0] for a in accesses]
    blamed_inputs = [r for r in deciding if r.name in (leaking or ())] or deciding
    named = [r.name for r in blamed_inputs] or written[:1]
    rows = f"rows {num_valid}..{padded - 1}"
    targets = ", ".join(sorted({str(int(t)) for a in accesses for t in a.flat[num_valid:].reshape(-1)[:4]}))
    where = (f"the padded entries of {', '.join(r.name for r in deciding)} decide where those rows write (poisoned "
             "alone, they move them)" if deciding else "no per-step input moves where they write (an index computed "
             "inside the callable)")
    evidence = [f"{accesses[0].op} writing {written[0]}: what it stores for the padded {rows} (elements {targets}) "
                f"reaches real rows: stored as copies of real rows' values, {leak.describe()}",
                f"{len(blamed)} of the forward's {len(writes)} padded indexed write(s) suffice; {where}"]
    if len(blamed_inputs) < len(deciding):
        evidence.append(f"named: {', '.join(named)}, whose padding also reaches real rows when poisoned alone")
    if leaking is None:
        evidence.append("poisoning the padded inputs changes nothing: they hold a pad marker no real entry holds, yet "
                        "the element it sends padded rows to is one real rows read; the eager run at the same padded "
                        "shape does the same, so only this experiment shows it")
    first = blamed_inputs[0].address if blamed_inputs else None
    return Experiment("PADDING_LEAK", f"store copies of real rows' values for the padded {rows} of "
                      f"{len(blamed)} indexed write(s) and run the callable eagerly", named, True, first, None,
                      evidence, leak.rows, leak.max_abs_diff)


def _moves(lab: ShadowLab, role: Role, num_valid: int, padded: int, blamed: list[int], accesses) -> bool:
    """Whether poisoning `role`'s padded entries alone moves where the blamed writes' padded rows write."""
    keep = Snapshot([role.tensor])
    try:
        _, moved = _eager(lab, num_valid, padded, change=lambda: fill_from_real(role.tensor, num_valid))
    finally:
        keep.restore()
    if max(blamed) >= len(moved.padded_writes):
        return True                                 # fewer padded writes: this input decides them
    after = [moved.accesses[moved.padded_writes[k]].flat for k in blamed]
    return any(not torch.equal(a.flat[num_valid:], b[num_valid:]) for a, b in zip(accesses, after))
