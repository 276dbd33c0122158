"""The pair a catalogued fault runs on: the embedded tiny-llama3-eagle, or (a fault with a `head`, the MTP
faults) a tiny synthetic pair of that head, built once per session with `parity models synth`'s defaults
(acceptance 0.8, seed 0) in float32 on the CPU: a few seconds."""

from __future__ import annotations

import tempfile
from pathlib import Path

from parity.builders.synth.build import synthesize
from parity.builders.synth.spec import TARGET_FOLDER, SynthRequest

_BUILT: dict[str, Path] = {}


def synth_pair(head: str) -> tuple[Path, Path]:
    """(target folder, draft folder) of the tiny pair `head` names: "mtp-deepseek [--mtp-layers N]"."""
    words = head.split()
    name, layers = words[0], int(words[words.index("--mtp-layers") + 1]) if "--mtp-layers" in words else 1
    if head not in _BUILT:
        out = Path(tempfile.mkdtemp(prefix="parity-synth-")) / name
        synthesize(SynthRequest("tiny", name, 0.8, "float32", str(out), 0, "cpu", layers), progress=lambda _: None)
        _BUILT[head] = out
    return _BUILT[head] / TARGET_FOLDER, _BUILT[head] / name


def fault_model(fault) -> tuple[str, tuple[str, ...]]:
    """(--model, the `parity run` arguments that go with it) for `fault`'s home pair."""
    if not fault.head:
        return "tiny-llama3-eagle", ()
    target, draft = synth_pair(fault.head)
    return "local", ("--target-path", str(target), "--draft-path", str(draft))
