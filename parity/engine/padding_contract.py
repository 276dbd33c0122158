"""A probed forward whose two poisons agree: what the padding contract still says about it.

Two poisons cannot show a breach that involves no poisoned value: a padded
row whose INERT entry names a live row's slot reads that row's own (unpoisoned)
data and writes it back over the row's outputs, identically under both. So,
when they agree:

0. padded rows whose indexed write targets an element a live row writes in the
   same op (read from poison A's run by the routes reader,
   `padding_routes.overwrite_leak`): named from the indices, the same on every
   backend (on CUDA the two writes race, and this run may keep the live one);
1. INERT padded entries off their pad value (`off_contract`): the forward is
   re-run with each breached buffer's padded entries set to the pad value (then
   all of them); a repair that changes live outputs names the buffer (PADDING_LEAK
   kind "contract"), with who holds the state slot its padded rows name;
2. (a diagnosis experiment, `inert_reads`) each INERT buffer's padded entries
   moved alone to another well-formed value: one a live row reads is named.
"""

from __future__ import annotations

from parity.engine.padding_regions import differing, inert_regions, off_contract
from parity.engine.padding_routes import overwrite_leak
from parity.engine.padding_state import slot_evidence


def agreed(probe, owner, dispatch, meta, index: int, run, out_a, result, recorder=None):
    """The forward's result after the checks above (a leak recorded on `probe` when one is found); `recorder`:
    poison A's run as the routes reader watched it."""
    if recorder is not None and overwrite_leak(probe, owner, dispatch, meta, index, recorder):
        return result
    off = off_contract(owner.buffers, dispatch)
    repairs = [[name] for name in sorted(off)] + ([sorted(off)] if len(off) > 1 else [])
    holders = slot_evidence(owner, dispatch, sorted(off))      # before a repair rewrites the padded entries
    for names in repairs:
        changed = differing(out_a, run([], repair=names)[0])
        if changed:
            leak = probe._leak(owner, dispatch, meta, index, sorted(changed))
            leak.buffers, leak.kinds = list(names), ["contract"]
            leak.regions = [f"{name} padded entries off the pad value {off[name][0]} ({off[name][1]} of them)"
                            for name in names]
            leak.experiment = (f"the padded forward re-run with {', '.join(names)}'s padded entries set to their "
                               f"pad values")
            leak.evidence = [f"the two poisons agree, but setting the padded entries of {', '.join(names)} to their "
                             f"pad values changes live outputs ({', '.join(sorted(changed)[:3])}): padded rows "
                             f"reach live ones through entries the builder left off the contract"]
            leak.evidence += [line for line in holders if any(f" {name} " in line for name in names)]
            return run([])[1]
    return inert_reads(probe, owner, dispatch, meta, index, run, out_a, result) if probe.inert_reads else result


def inert_reads(probe, owner, dispatch, meta, index: int, run, out_a, result):
    """Each INERT buffer's padded entries moved alone to another well-formed value: the ones a live row
    reads (its outputs change) are a leak the two poisons cannot show, since both keep pad values."""
    read = [r for r in inert_regions(owner.buffers, dispatch) if differing(out_a, run([r])[0])]
    if not read:
        return result
    leak = probe._leak(owner, dispatch, meta, index, sorted(differing(out_a, run(read)[0])))
    leak.buffers, leak.regions, leak.kinds = sorted({r.buffer for r in read}), [r.label() for r in read], ["inert"]
    leak.experiment = "the padded forward re-run with one INERT buffer's padded entries moved off their pad value"
    leak.evidence = [f"moving the padded entries of {', '.join(r.buffer for r in read)} off their pad values (to "
                     f"other well-formed values) changes live outputs: a live row reads a padded row's entry"]
    _, result = run([])
    return result
