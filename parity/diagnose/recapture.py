"""FROZEN_AT_CAPTURE: re-capture with the same tensors and one host value changed, and replay.

A graph bakes in the Python values its forward used at capture (a draft step
index, a window start, a row count). Each experiment re-captures the forward
from the capture-time metadata object (so the graph reads the very same
addresses) with exactly one host value set to its live value, and replays it
on the live metadata. A control re-capture with every host value as captured
must not restore parity: if it does, the original capture, not a baked value,
is at fault. When no single value restores parity but all of them together
do, delta debugging finds the smallest set.

A value can also be baked from a tensor: a forward that reads a buffer to the
host while capturing (`.tolist()`, `.item()`) replays what the buffer held at
capture. When a fresh capture from the live state restores parity, each
integer buffer whose capture-time contents (recorded by the graph manager)
differ from the live ones is put back, alone, to those contents before a
re-capture (after a control with all of them put back brings the divergence
back): the one that brings it back alone is FROZEN_AT_CAPTURE.
Otherwise UNEXPLAINED, with everything that was ruled out and the layer
probes' localisation.
"""

from __future__ import annotations

import torch

from parity.diagnosis.kinds import CAPTURE_CONTEXT, FROZEN_AT_CAPTURE, UNEXPLAINED
from parity.audit.one_variable import search
from parity.audit.writes import absent_evidence
from parity.diagnosis.record import Diagnosis
from parity.diagnose.lab import Divergence
from parity.diagnose.probes import probe_layers
from parity.diagnose.readset import graph_writes, reference_writes
from parity.graphs.manager import python_fields
from parity.graphs import host_state
from parity.graphs.host_state import short
from parity.graphs.tp_agree import agree_same, agree_union, merged_lines


def recaptured(lab: Divergence, fields: dict, contents=(), host: dict | None = None) -> bool:
    """Re-capture the forward from the capture-time metadata with `fields` set (host values, or inputs that
    were absent), the buffers `contents` put back to what the original capture saw and the owner's host values
    `host` ({path: value}) set, and replay it on the live state: does it give the reference's outputs?"""
    registries = {(r.owner, name): t for r in lab.executor.registries for name, t in r.items()}
    holder = lab.snaps["graph"]["host"][lab.ev_g.owner][0]

    def prepare():
        for key in contents:      # under TP a buffer another rank named is put back where this rank has it
            if key in registries and key in lab.entry.captured_contents:
                registries[key].copy_(lab.entry.captured_contents[key])
        for path, value in (host or {}).items():
            if not host_state.put(holder, path, value):
                raise ValueError(f"{host_state.name(path)} cannot be set")
    return lab.matches(lab.run(graph=lab.recapture(fields, prepare)))


def absent_inputs(lab: Divergence) -> Diagnosis | None:
    """CAPTURE_CONTEXT when a metadata input was absent (None) at capture and the re-capture with only it
    present restores parity: the graph lacks the work that reads it (named: the writes it skips, and the
    input). None (ruled out) otherwise."""
    live = lab.ev_g.meta
    absent = agree_same("absent inputs", sorted(k for k, v in lab.entry.captured_with.items()
                                                if v is None and isinstance(getattr(live, k, None), torch.Tensor)))
    if not absent:
        return None
    # the control: a re-capture as captured must still differ
    found = search(absent, lambda names: _restores(lab, {k: getattr(live, k) for k in names}), first=True)
    lab.ruled_out += [f"re-capture with only {name} present (None at capture)"
                      for name, restores in found.singles if not restores]
    if not found.restoring:
        return None
    name = found.restoring[0]
    skipped = sorted(reference_writes(lab) - graph_writes(lab))
    evidence = absent_evidence(f"the metadata's {name}", skipped, "the reference forward")
    experiment = (f"re-capture with only {name} present (the live metadata's tensor; None at capture), same "
                  "addresses: replaying restores bitwise parity; the control re-capture as captured does not")
    return lab.diagnosis(CAPTURE_CONTEXT, [*skipped, name], evidence=evidence + [experiment],
                         experiment=experiment)


def _restores(lab: Divergence, fields: dict) -> bool:
    try:
        return recaptured(lab, fields)
    except (RuntimeError, IndexError, ValueError, TypeError, AttributeError):   # not capturable so
        return False


def stage(lab: Divergence) -> Diagnosis:
    """The last stage: FROZEN_AT_CAPTURE when a re-capture isolates a baked value, else UNEXPLAINED."""
    live_meta, entry, executor = lab.ev_g.meta, lab.entry, lab.executor
    live_fields = python_fields(live_meta)
    captured = entry.captured_with
    differing = agree_same("recapture: host fields",
                           sorted(k for k in live_fields if captured.get(k) != live_fields[k]))
    registries = {(r.owner, name): t for r in executor.registries for name, t in r.items()}

    def recaptured_matches(live: dict, contents=()) -> bool:
        """Re-capture with host values `live` changed and the buffers `contents` as the original capture saw."""
        try:
            return recaptured(lab, live, contents)
        except (RuntimeError, IndexError, ValueError) as exc:   # the forward cannot run on these values
            ruled.append(f"re-capture with {sorted(live) or 'the captured values'} failed: {str(exc)[:80]}")
            return False

    ruled = lab.ruled_out
    found = search(differing, lambda keys: recaptured_matches({k: live_fields[k] for k in keys}), minimise=True)
    if found.control:
        lab.restore()
        moved = sorted(k for k, t in entry.captured_contents.items() if k in registries
                       and registries[k].shape == t.shape and not torch.equal(registries[k].cpu(), t))
        moved = [tuple(k) for k in agree_union("recapture: buffers moved since capture", moved)]
        if moved and not recaptured_matches({}, moved):
            baked = [k for k in moved if not recaptured_matches({}, [k])]
            if baked:
                return _baked(lab, [k[1] for k in baked], moved)
        ruled.append("a fresh capture from the live state restores parity, yet no host value and no buffer's "
                     "capture-time contents alone bring the divergence back: the original capture differs")
    elif differing:
        frozen = found.restoring or found.smallest
        if frozen:
            return _frozen(lab, frozen, captured, live_fields)
        ruled.append("re-capture with the live value of " + ", ".join(differing))
    else:
        ruled.append("a fresh capture from the live state does not restore parity, and no host value differs "
                     "from the capture's")
    evidence = ["no one-variable experiment restores bitwise parity",
                *merged_lines("recapture: layer probes", probe_layers(lab))]
    return lab.diagnosis(UNEXPLAINED, [], evidence=evidence)


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


def _frozen(lab: Divergence, frozen, captured, live_fields) -> Diagnosis:
    evidence = [f"{k}: captured {short(captured.get(k))}, live {short(live_fields[k])}" for k in frozen]
    evidence.append(f"re-capturing with the same tensors and only the live {', '.join(frozen)} restores bitwise "
                    "parity; the control re-capture with the captured values does not")
    experiment = f"re-capture with the live {', '.join(frozen)} (same addresses, one host value changed)"
    return lab.diagnosis(FROZEN_AT_CAPTURE, frozen, evidence=evidence, experiment=experiment)
