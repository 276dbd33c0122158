"""The diagnosis panel, pinned: a saved STALE_BUFFER diagnosis (from the second engine) and its rendering.

`UPDATE_GOLDEN=1 pytest tests/test_audit_render.py` rewrites the expected text
from the current renderer (review the diff before committing).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from parity.audit import DIAGNOSIS_KEYS, render_diagnosis
from parity.audit.diagnosis import make_diagnosis

GOLDEN = Path(__file__).resolve().parent / "golden" / "audit"


def test_panel_matches_golden():
    diagnosis = json.loads((GOLDEN / "stale_buffer.json").read_text())
    assert list(diagnosis) == list(DIAGNOSIS_KEYS)
    text = render_diagnosis(diagnosis, width=100)
    expected = GOLDEN / "stale_buffer.txt"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        expected.write_text(text)
    assert text == expected.read_text()
    assert "\x1b[" not in text and all(len(line) <= 100 for line in text.splitlines())


def test_the_guide_shows_the_golden_panel():
    guide = (Path(__file__).resolve().parent.parent / "docs" / "audit.md").read_text()
    assert (GOLDEN / "stale_buffer.txt").read_text() in guide, "docs/audit.md section 3: paste the golden panel"


def test_long_lists_are_cut():
    d = make_diagnosis("UNEXPLAINED", [], owner="g", replay=3, ruled_out=[f"experiment {i}" for i in range(9)])
    text = render_diagnosis(d, width=100)
    assert "experiment 5" in text and "experiment 6" not in text and "... and 3 more" in text
