"""STAGING_RACE: an overlapped mode's divergence explained by experiment on its host staging.

The overlapped loop (`engine/overlap.py`) moves every host-built input and every
read-back output through staging slots, streams and events (`engine/staging.py`).
When an overlapped mode differs from its padded reference (which runs the
synchronous loop), this stage re-runs the mode with the staging changed, one
variable at a time, and compares each run with the reference bit for bit:

1. every staged buffer synchronous (blocking copies, as the synchronous loop does):
   parity not restored -> not a staging race (the other stages take over);
2. one-variable over the buffers: the smallest group whose synchronous staging
   restores parity (one owner's buffers, then halves), then within it each buffer whose race alone (every
   other buffer synchronous) breaks parity: the buffers named;
3. which event the race crossed: waiting the named copies only before their slot
   or rows are reused (`free`), or only before the forward that reads them (`ready`);
   the first experiment that restores parity names it.
The step is the first engine step whose records differ.
"""

from __future__ import annotations

from parity.analysis.reference_parity import reference_parity
from parity.diagnosis.kinds import STAGING_RACE
from parity.diagnosis.record import Diagnosis
from parity.engine.staging import CONSUME, REUSE, SYNC

EVENTS = {REUSE: ("free", "the copy had not read its source yet when the slot or rows were written again"),
          CONSUME: ("ready", "the forward read the buffer before its copy landed")}


class StagingLab:
    """Runs the overlapped mode under staging experiments; counts them; compares with the reference."""

    def __init__(self, run, reference, keys):
        self.run, self.reference, self.keys = run, reference, list(keys)
        self.runs = 0

    def restored(self, sync: dict[str, str]) -> bool:
        self.runs += 1
        return reference_parity(self.run(sync), self.reference, "reference").bitwise_equal

    def synchronous(self, keys) -> bool:
        return self.restored({k: SYNC for k in keys})

    def smallest_group(self, keys: list[str]) -> list[str]:
        """One owner's buffers first, then halves, while the part's synchronous staging alone restores parity."""
        owners = list(dict.fromkeys(k.split(".", 1)[0] for k in keys))
        if len(owners) > 1:
            for owner in owners:
                part = [k for k in keys if k.split(".", 1)[0] == owner]
                if self.synchronous(part):
                    keys = part
                    break
        while len(keys) > 1:
            half = len(keys) // 2
            for part in (keys[:half], keys[half:]):
                if self.synchronous(part):
                    keys = part
                    break
            else:
                return keys
        return keys

    def racers(self, group: list[str]) -> list[str]:
        """The buffers whose race alone (every other buffer synchronous) breaks parity: those of `group` first,
        else any. Asked even of a group of one: on CUDA any change of staging moves every copy's timing, so
        that syncing a buffer restores parity does not show that its race broke it."""
        for keys in (group, [k for k in self.keys if k not in group]):
            found = [k for k in keys if not self.synchronous([o for o in self.keys if o != k])]
            if found:
                return found
        return []

    def event(self, keys: list[str]) -> tuple[str | None, str, list[str]]:
        """(the event whose wait restores parity, why, the events whose wait did not)."""
        tried = []
        for lever in (REUSE, CONSUME):
            if self.restored({k: lever for k in keys}):
                return (*EVENTS[lever], tried)
            tried.append(EVENTS[lever][0])
        return None, "neither wait alone restores parity: only synchronous staging does", tried


def diagnose(run, reference, overlapped, staged: dict[str, list[str]], mode: str) -> Diagnosis | None:
    """STAGING_RACE for `mode`, or None when synchronous staging does not restore parity.

    `run(sync)` runs the overlapped mode under a staging experiment and returns its RunResult; `reference` is the
    result the verdict compared with; `overlapped` the mode's own result; `staged` maps each staged
    "<owner>.<buffer>" to the phases of the forwards it feeds (or whose output it reads back).
    """
    lab = StagingLab(run, reference, staged)
    if not staged or not lab.synchronous(lab.keys):
        return None
    group = lab.smallest_group(lab.keys)
    racers = lab.racers(group)
    named = racers or group
    event, how, failed = lab.event(named)
    first = reference_parity(overlapped, reference, "reference").first_difference or {}
    owners = list(dict.fromkeys(k.split(".", 1)[0] for k in named))
    # Buffers are named only when a race alone was isolated; else the kind stands (all-synchronous staging restores
    # parity) and the group syncing restored parity for is evidence, not a name.
    buffers = list(dict.fromkeys(k.split(".", 1)[1] for k in racers))
    phases = list(dict.fromkeys(p for k in named for p in staged.get(k, ())))
    evidence = [f"every staged buffer synchronous ({len(lab.keys)} buffers): parity restored",
                f"synchronous staging of {', '.join(group)} alone restores parity"]
    if racers:
        evidence.append(f"the race of each of {', '.join(named)} alone (every other buffer synchronous) breaks it")
    else:
        evidence.append("no buffer's race alone (every other buffer synchronous) breaks it: syncing the buffers "
                        "above restores parity, but no race was isolated to one of them (on CUDA a change of "
                        "staging moves every copy's timing), so none is named")
    evidence.append(f"event: {event} ({how})" if event else how)
    return Diagnosis(STAGING_RACE, buffers, mode, owner=", ".join(owners), step=first.get("step"),
                     phase=", ".join(phases) or None,
                     evidence=evidence, replays=lab.runs,
                     experiment=f"stage {', '.join(named)} synchronously" + (
                         f"; or wait each one's {event} event" if event else ""),
                     ruled_out=[f"waiting only the {e} event of {', '.join(named)}" for e in failed])
