"""PADDING_LEAK: poison the padded rows of the graph's per-step inputs and watch the real rows.

A graph replays at a padded batch size; rows past the real batch hold whatever
the buffers held. Padding is inert when the real rows' outputs do not depend
on it, so the check replays once with the padded rows of every per-step input
poisoned and compares the real rows with the real replay's. The shadow check
cannot see a leak (eager at the padded shape leaks the same way), so this
check runs at the first replay of each graph with padded rows, and at every
checked replay where the number of real rows is known (`num_valid`). When it
fires, one input at a time is poisoned to name those whose padding leaks.

Per-step inputs: tensors the graph reads but does not write, with the padded
batch as leading dimension, that were written since capture (weights never
are) or are declared static inputs. Poisons:
- floating point: NaN;
- integer (token ids, positions, slots, cache rows): values copied from the
  buffer's own real entries, so every poisoned index is one the kernels
  accept; a correct forward's real rows cannot depend on them. An integer
  buffer whose padded entries all hold one value no real entry holds (a pad
  slot -1, a trash row, a zero length) is inert by its own contract and left
  alone: any other value would make a correct kernel act on a padded row.
`padding={role name: value}` overrides the poison of the inputs it names.
An integer input whose padding leaks decides where padded rows' values go,
so it is named ahead of float inputs whose poison reached real rows through it.
"""

from __future__ import annotations

import torch

from parity.audit.experiments import Experiment
from parity.audit.lab import ShadowLab
from parity.audit.padded_values import fill_from_real, stored_leak
from parity.audit.record import Role
from parity.audit.state import Result, Snapshot, clone_outputs, compare
from parity.graphs.roles import resolve


def padding_roles(lab: ShadowLab, padded: int, spec: dict | None) -> list[Role]:
    """The per-step inputs with `padded` rows, plus the roles named in `spec`, one per tensor."""
    picked: dict[tuple[int, int], Role] = {}
    spec = spec or {}
    roles = [r for r in lab.record.roles if r.tensor.dim() and r.tensor.shape[0] == padded and not r.written
             and r.tensor.dtype != torch.bool]
    # A tensor is a per-step input when any of its roles says so (declared, named in `spec`, written since
    # capture); it is named as every other check names it (`Role.owner_rank`), a `spec` name first.
    inputs = {(r.storage, r.address) for r in roles if r.name in spec or r.declared or r.changed()}
    # NOTE: the persistent buffer (a path that still reaches the captured tensor) names it best.
    for role in sorted(roles, key=lambda r: (resolve(r.path, lab.roots) is not r.tensor, r.name not in spec)
                       + r.owner_rank):
        if (role.storage, role.address) in inputs:
            picked.setdefault((role.storage, role.address), role)
    return list(picked.values())


def inert_sentinel(t: torch.Tensor, num_valid: int) -> bool:
    """Integer padding that is one value no real entry holds: the engine's own pad marker."""
    pad, real = t[num_valid:].reshape(-1), t[:num_valid].reshape(-1)
    return bool((pad == pad[0]).all()) and not bool((real == pad[0]).any())


def _poison(t: torch.Tensor, num_valid: int, value) -> None:
    if value is not None:
        t[num_valid:].fill_(value)
    elif t.is_floating_point() or t.is_complex():
        t[num_valid:].fill_(float("nan"))
    else:
        fill_from_real(t, num_valid)


def _poisoned_run(lab: ShadowLab, roles: list[Role], num_valid: int, spec: dict) -> Result:
    keep = Snapshot([r.tensor for r in roles])

    def change():
        for r in roles:
            _poison(r.tensor, num_valid, spec.get(r.name))
    try:
        result = lab.run(change)
    finally:
        keep.restore()
    return Result(result.outputs)


def _integer(role: Role) -> bool:
    return not (role.tensor.is_floating_point() or role.tensor.is_complex())


def padding_check(lab: ShadowLab, replayed: Result, num_valid: int, padded: int, spec: dict | None = None
                  ) -> Experiment | None:
    """A PADDING_LEAK experiment when poisoning padded rows changes real rows; None when padding is inert."""
    spec = spec or {}
    if num_valid >= padded or num_valid <= 0:
        return None
    inputs = padding_roles(lab, padded, spec)
    roles = [r for r in inputs if r.name in spec or not _integer(r) or not inert_sentinel(r.tensor, num_valid)]
    if not roles:
        return stored_leak(lab, inputs, num_valid, padded)
    reference = Result(clone_outputs(replayed.outputs))
    names = lab.record.output_names

    def leaks(subset):
        return compare(_poisoned_run(lab, subset, num_valid, spec), reference, names, rows=num_valid, padded=padded)
    leak = leaks(roles)
    if leak is None:
        return stored_leak(lab, inputs, num_valid, padded)
    leaking = [r for r in roles if leaks([r]) is not None]
    routed = stored_leak(lab, inputs, num_valid, padded, tuple(r.name for r in leaking))
    if routed is not None and set(routed.buffers) <= {r.name for r in inputs}:
        # NOTE: padding that reaches real rows through what padded rows store is named by the input that
        # decides where they store it, ahead of the inputs whose poison travelled that way.
        routed.evidence.insert(1, f"poisoned alone, the padding of {', '.join(r.name for r in leaking)} reaches "
                                  "real rows too, through those stores" if leaking else
                                  "poisoning the padded inputs together reaches real rows too, through those stores")
        return routed
    indices = [r for r in leaking if _integer(r)]
    named = [r.name for r in (indices or leaking or roles)]
    rows = f"rows {num_valid}..{padded - 1}"
    evidence = [f"poison in the padded {rows} of {', '.join(r.name for r in roles)} reaches real rows: "
                f"{leak.describe()}",
                f"poisoned alone, the padding of {', '.join(named)} reaches real rows" if leaking else
                "no single input's padding leaks alone; together they do",
                f"real rows 0..{num_valid - 1} must not depend on padding; the eager run at the same padded shape "
                "leaks the same way, so only poisoning shows it"]
    downstream = [r.name for r in leaking if r not in indices] if indices else []
    if downstream:
        evidence.append(f"{', '.join(downstream)} leak(s) too when poisoned alone; named after "
                        f"{', '.join(named)}, whose padded entries decide where padded rows' values go")
    first = (indices or leaking or [None])[0]
    return Experiment("PADDING_LEAK", f"poison the padded {rows} of {', '.join(named)} and replay",
                      named, True, first.address if first else None, None, evidence, leak.rows, leak.max_abs_diff)
