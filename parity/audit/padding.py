"""PADDING_LEAK: poison the padded rows of the graph's per-step inputs and watch the real rows.

A graph replays at a padded batch size; rows past the real batch hold whatever
the buffers held. Padding is inert when the real rows' outputs do not depend
on it, so the check replays once with the padded rows of every per-step
floating-point input set to NaN and compares the real rows with the real
replay's. The shadow check cannot see a leak (eager at the padded shape leaks
the same way), so this check runs at every checked replay where the number
of real rows is known (`num_valid`). When it fires, one input at a time is
poisoned to name those whose padding leaks.

Per-step inputs: floating-point tensors the graph reads but does not write,
with the padded batch as leading dimension, that were written since capture
(weights never are) or are declared static inputs; they are poisoned with NaN.
Integer inputs are left alone unless the padding spec names them with a
poison value: their padded entries (positions, slots) are the engine's to
make inert, and blind poison would make a correct engine write where it must not.
"""

from __future__ import annotations

from parity.audit.experiments import Experiment, Lab
from parity.audit.record import Role
from parity.audit.state import Result, Snapshot, clone_outputs, compare


def padding_roles(lab: Lab, padded: int, spec: dict | None) -> list[Role]:
    """The per-step floating-point inputs with `padded` rows, plus the roles named in `spec`, one per tensor."""
    picked: dict[tuple[int, int], Role] = {}
    spec = spec or {}
    for role in sorted(lab.record.roles, key=lambda r: not r.declared):
        t = role.tensor
        if not t.dim() or t.shape[0] != padded or role.written:
            continue
        if role.name in spec or (t.is_floating_point() and (role.declared or role.changed())):
            picked.setdefault((role.storage, role.address), role)
    return list(picked.values())


def _poisoned_run(lab: Lab, roles: list[Role], num_valid: int, spec: dict | None) -> Result:
    keep = Snapshot([r.tensor for r in roles])
    spec = spec or {}

    def replay():
        for r in roles:
            r.tensor[num_valid:].fill_(spec.get(r.name, float("nan")))
        lab.audit._raw_replay()
    try:
        result = lab.run(replay, lab.record.outputs)
    finally:
        keep.restore()
    return Result(result.outputs)


def padding_check(lab: Lab, replayed: Result, num_valid: int, padded: int, spec: dict | None = None
                  ) -> Experiment | None:
    """A PADDING_LEAK experiment when poisoning padded rows changes real rows; None when padding is inert.

    `spec` ({role name: poison value}) adds inputs to poison (integer ones, say
    token ids, with a valid id) and sets their poison; the default is NaN.
    """
    if num_valid >= padded:
        return None
    roles = padding_roles(lab, padded, spec)
    if not roles:
        return None
    reference = Result(clone_outputs(replayed.outputs))
    names = lab.record.output_names
    leak = compare(_poisoned_run(lab, roles, num_valid, spec), reference, names, rows=num_valid, padded=padded)
    if leak is None:
        return None
    leaking = [r for r in roles if compare(_poisoned_run(lab, [r], num_valid, spec), reference, names,
                                           rows=num_valid, padded=padded) is not None]
    named = [r.name for r in (leaking or roles)]
    rows = f"rows {num_valid}..{padded - 1}"
    evidence = [f"poison in the padded {rows} of {', '.join(named)} reaches real rows: {leak.describe()}",
                f"real rows 0..{num_valid - 1} must not depend on padding; the eager run at the same padded shape "
                "leaks the same way, so only poisoning shows it"]
    if not leaking:
        evidence.append("no single input's padding leaks alone; together they do")
    return Experiment("PADDING_LEAK", f"poison the padded {rows} of {', '.join(named)} and replay",
                      named, True, leaking[0].address if leaking else None, None, evidence, leak.rows,
                      leak.max_abs_diff)
