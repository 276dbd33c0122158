"""FROZEN_AT_CAPTURE: re-capture with the same tensors and one host value changed, and replay.

A graph bakes in the Python values its forward used at capture (a draft step
index, a window start, a row count), and lacks the work of code that did not
run at capture (an input None then: CAPTURE_CONTEXT). The experiments are the
audit's (`audit/recaptures.py`) on the lab's host values (`Divergence.host_values`:
the owner's values the forward advances itself, `host_moves.moved`, the
metadata's host fields, and its inputs absent at capture): each
re-captures the forward from the capture-time metadata object (so the graph
reads the very same addresses) with one value at its live value, and replays
it on the live metadata, as the audit's localisation does on its shadow run.
When the control re-capture (every value as captured) restores parity, the
original capture, not a baked value, is at fault: perhaps a value baked from a
tensor (a forward that reads a buffer to the host while capturing,
`.tolist()`, `.item()`, replays what the buffer held then). Each integer
buffer whose capture-time contents (recorded by the graph manager) differ
from the live ones is put back, alone, to those contents before a re-capture
(after a control with all of them put back brings the divergence back): the
one that brings it back alone is FROZEN_AT_CAPTURE.
Otherwise UNEXPLAINED, with everything that was ruled out and the layer
probes' localisation.
"""

from __future__ import annotations

import torch

from parity.audit import recaptures
from parity.diagnosis.kinds import FROZEN_AT_CAPTURE, UNEXPLAINED
from parity.diagnosis.record import Diagnosis
from parity.diagnose.lab import Divergence
from parity.diagnose.probes import probe_layers
from parity.graphs.tp_agree import agree_union, merged_lines


def stage(lab: Divergence) -> Diagnosis:
    """The last stage: a host value baked at capture, or an input absent then (`audit.recaptures.stage`, on the
    metadata's host fields), or a buffer's capture-time contents read to the host; else UNEXPLAINED."""
    found = recaptures.stage(lab, fresh=_contents)
    if found is not None:
        return found
    evidence = ["no one-variable experiment restores bitwise parity",
                *merged_lines("recapture: layer probes", probe_layers(lab))]
    return lab.diagnosis(UNEXPLAINED, [], evidence=evidence)


def _contents(lab: Divergence) -> Diagnosis | None:
    """A fresh capture from the live state restores parity: the buffers whose capture-time contents alone bring
    the divergence back (None, told in `lab.ruled_out`, when none does)."""
    entry, ruled = lab.entry, lab.ruled_out
    registries = {(r.owner, name): t for r in lab.executor.registries for name, t in r.items()}

    def put_back(contents):
        for key in contents:      # under TP a buffer another rank named is put back where this rank has it
            if key in registries and key in entry.captured_contents:
                registries[key].copy_(entry.captured_contents[key])

    def contents_matter(contents) -> bool:
        """Re-capture from the capture-time metadata with the buffers `contents` put back to what the original
        capture saw, and replay it on the live state: does it give the reference's outputs?"""
        try:
            return lab.matches(lab.run(graph=lab.recapture({}, lambda: put_back(contents))))
        except (RuntimeError, IndexError, ValueError) as exc:   # the forward cannot run on these values
            ruled.append(f"re-capture with the captured values failed: {str(exc)[:80]}")
            return False

    lab.restore()
    moved = sorted(k for k, t in entry.captured_contents.items() if k in registries
                   and registries[k].shape == t.shape and not torch.equal(registries[k].cpu(), t))
    moved = [tuple(k) for k in agree_union("recapture: buffers moved since capture", moved)]
    if moved and not contents_matter(moved):
        baked = [k for k in moved if not contents_matter([k])]
        if baked:
            return _baked(lab, [k[1] for k in baked], moved)
    ruled.append("a fresh capture from the live state restores parity, yet no host value and no buffer's "
                 "capture-time contents alone bring the divergence back: the original capture differs")
    return None


def _baked(lab: Divergence, names, moved) -> Diagnosis:
    """Buffers whose contents the forward read to the host while capturing (a `.tolist()`, an `.item()`)."""
    evidence = [f"{', '.join(names)}: the contents the original capture saw differ from the live ones",
                f"a re-capture from the live state restores bitwise parity; with {', '.join(names)} put back to "
                "its capture-time contents (and nothing else) the divergence returns: the forward read it to "
                "the host while capturing, and the graph replays those values"]
    experiment = (f"re-capture from the live state with only {', '.join(names)} at its capture-time contents "
                  "(same addresses, same host values)")
    others = sorted({k[1] for k in moved} - set(names))
    if others:
        lab.ruled_out.append(f"the capture-time contents of {', '.join(others)}")
    return lab.diagnosis(FROZEN_AT_CAPTURE, names, evidence=evidence, experiment=experiment)
