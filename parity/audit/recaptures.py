"""Re-capture experiments on any `Lab`: the host values a graph baked at capture, and inputs absent then.

A graph replays the Python values its capture read (a step index, a scale, a
window start) and lacks the work of code that did not run at capture (a branch
on an input that was None then). The lab lists each host value that differs
between the capture and now (`lab.host_values()`, by its own key and name);
each experiment re-captures the forward with every one of them set (a chosen
few at their live value, the rest as captured) and replays the new graph:
- the control, every value as captured: when it restores parity no host value
  is the cause (something else about the original capture is);
- each value alone at its live value: FROZEN_AT_CAPTURE; an input absent at
  capture: CAPTURE_CONTEXT, naming the writes the graph skips
  (`lab.skipped_writes()`, what the reference writes and the graph never does)
  and the input;
- with `minimise`, delta debugging over them when only several together do.

`stage(lab, fresh)` runs them and names the value (or the smallest set); a
restoring control is handed to `fresh(lab)`, the lab's own account of what
else the original capture baked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.audit.experiments import Experiment
from parity.audit.one_variable import Search, search
from parity.audit.writes import absent_evidence
from parity.graphs.host_state import short

CONTROL = "re-capture with every host value as captured (control) and replay"
FAILURES = (RuntimeError, TypeError, AttributeError, ValueError, IndexError)


@dataclass
class HostValue:
    key: object                  # what `lab.recapture` takes (a path, a metadata field)
    name: str
    captured: object
    live: object                 # what the forward should read now: the live value (a moved one: the reference's)
    moved: tuple | None = None   # (before, after) when the forward advances it itself, run as the reference

    @property
    def absent(self) -> bool:
        """An input that was None at capture and holds a tensor now."""
        return self.captured is None and isinstance(self.live, torch.Tensor)


def restores(lab, overrides: dict) -> bool:
    """Does a re-capture with `overrides` restore parity? False (told in `lab.ruled_out`) when the forward cannot
    be captured so."""
    try:
        return lab.matches(lab.run(graph=lab.recapture(overrides)))
    except FAILURES as exc:
        lab.ruled_out.append(f"re-capture with {sorted(map(str, overrides)) or 'the captured values'} failed: "
                             f"{str(exc)[:80]}")
        return False


def host_search(lab, values: list[HostValue], minimise: bool = False) -> Search:
    """The control, each value alone at its live value, then (`minimise`) the smallest set (`one_variable`)."""
    def restored(subset) -> bool:
        chosen = {id(v) for v in subset}
        return restores(lab, {v.key: v.live if id(v) in chosen else v.captured for v in values})
    return search(values, restored, minimise=minimise)


def describe(value: HostValue) -> str:
    """The re-capture with `value` alone at its live value, in words."""
    if value.absent:
        return f"re-capture with only {value.name} present (its live tensor; None at capture) and replay"
    at = "the value the forward starts from" if value.moved is not None else "its live value"
    return (f"re-capture with only {value.name} at {at} ({short(value.live)}; captured {short(value.captured)}) "
            "and replay")


def single_experiment(lab, value: HostValue, restored: bool) -> Experiment:
    """The re-capture with `value` alone at its live value, as an experiment of its kind."""
    if value.absent:
        skipped = lab.skipped_writes()
        return Experiment("CAPTURE_CONTEXT", describe(value), [*skipped, value.name], restored,
                          evidence=absent_evidence(value.name, skipped, "the reference"))
    return Experiment("FROZEN_AT_CAPTURE", describe(value), [value.name], restored,
                      evidence=frozen_evidence([value]))


def set_experiment(values: list[HostValue]) -> Experiment:
    """The smallest set of host values that restores parity only together."""
    names = [v.name for v in values]
    return Experiment("FROZEN_AT_CAPTURE", f"re-capture with only {', '.join(names)} at their live values and "
                      "replay (together: no single one restores parity)", names, True,
                      evidence=frozen_evidence(values))


def frozen_evidence(values: list[HostValue]) -> list[str]:
    evidence = []
    for v in values:
        evidence.append(f"{v.name}: captured {short(v.captured)}, live {short(v.live)}: the graph replays the "
                        "captured value")
        if v.moved is not None:
            evidence.append(f"{v.name} is advanced by the forward itself (run eagerly it moved {short(v.moved[0])} "
                            f"-> {short(v.moved[1])}): a replay runs no Python, so it neither reads the live value "
                            "nor moves it")
    return evidence


def stage(lab, fresh=None):
    """The host value, or smallest set of them, whose live value alone in a re-capture restores parity, named
    (`lab.diagnosis`; the others that restore it alone told in `also`). When the control re-capture restores
    parity no host value is the cause: `fresh(lab)` says what else about the original capture is (None: nothing
    named). None, the re-captures added to `lab.ruled_out`, when nothing restores parity."""
    values = lab.host_values()
    found = host_search(lab, values, minimise=True)
    if found.control:
        return fresh(lab) if fresh is not None else None
    if found.restoring or found.smallest:
        named = (single_experiment(lab, found.restoring[0], True) if found.restoring
                 else set_experiment(found.smallest))
        evidence = named.evidence + [f"{named.description}: restores bitwise parity; the control re-capture with "
                                     "every host value as captured does not"]
        also = [f"{describe(v)} also restores parity" for v in found.restoring[1:]]
        ruled_out = lab.ruled_out + [CONTROL] + [describe(v) for v, restored in found.singles if not restored]
        return lab.diagnosis(named.kind, named.buffers, evidence=evidence, experiment=named.description,
                             ruled_out=ruled_out, also=also)
    lab.ruled_out += [CONTROL if values else CONTROL.replace("(control)", "(control: none differs from now)"),
                      *(describe(v) for v, _ in found.singles)]
    return None
