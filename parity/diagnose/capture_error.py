"""CAPTURE_ERROR: a graph's capture stopped at an op no graph can capture, named by the engine's source line.

The experiment is the capture itself: the mode's graphs are captured one by
one, and the one that stops names its owner, phase and padded shape; the
traceback, walked to the innermost frame of the engine's (or the user's) code,
names the line that made the call (`graphs/capture_errors.py`). The same
forward runs eagerly, at the same padded shape, in the mode's reference: only
capturing it fails.
"""

from __future__ import annotations

from parity.diagnosis.kinds import CAPTURE_ERROR
from parity.diagnosis.record import Diagnosis
from parity.graphs.capture_errors import CaptureError


def diagnose(mode: str, error: CaptureError) -> Diagnosis:
    """The diagnosis of a mode whose capture raised `error` (found at capture: no step)."""
    wanted, source = error.captured_for, error.source
    named = [source.name, source.function] if source is not None else []   # the line, and the function it is in
    evidence = [f"capturing the {wanted.describe()} stopped: {error.message}"]
    if source is not None:
        evidence.append(f"called at {source.name}, in {source.function}: {source.code}")
    else:
        evidence.append("every frame of the traceback is torch's or the capture's own: no engine line to name")
    evidence.append("a graph cannot capture a host sync or a data-dependent shape: read the value before the "
                    "captured forward (from host state the builder keeps), or keep it on the device")
    return Diagnosis(CAPTURE_ERROR, named, mode, owner=wanted.owner, phase=wanted.phase,
                     graph={"runtime_mode": wanted.runtime_mode, "num_tokens": wanted.descriptor.num_tokens,
                            "num_reqs": error.num_reqs},
                     evidence=evidence,
                     experiment=f"capture each graph of the mode alone: the {wanted.describe()} stops at "
                                f"{source.name if source else 'an op of torch'}")
