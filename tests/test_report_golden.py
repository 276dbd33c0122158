"""Golden renderings of saved runs: console (80 columns, no colour) and report.md.

tests/golden/<run>/summary.json are saved runs of the tiny pair (see
tests/golden/README.md); console.txt and report.md are their expected
renderings. `UPDATE_GOLDEN=1 pytest tests/test_report_golden.py` rewrites the
expected files from the current renderers (review the diff before committing).
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console

from parity.report.console import render
from parity.report.diagnosis import diagnoses_view
from parity.report.markdown import render_markdown
from tests.robustkit import forked_cli

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
RUNS = sorted(p.name for p in GOLDEN.iterdir() if (p / "summary.json").is_file())
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
ANSI = re.compile(r"\x1b\[")


def load(run: str) -> dict:
    return json.loads((GOLDEN / run / "summary.json").read_text())


def console_text(summary: dict) -> str:
    console = Console(width=80, no_color=True, record=True, file=io.StringIO())
    render(summary, console=console, diagnosis_panel=diagnoses_view(summary))
    return console.export_text()


def check_golden(path: Path, actual: str) -> None:
    if UPDATE:
        path.write_text(actual)
        return
    assert path.is_file(), f"{path} missing: run with UPDATE_GOLDEN=1 to create it"
    assert actual == path.read_text(), f"{path} differs from the rendering (UPDATE_GOLDEN=1 rewrites it)"


def cli(*args: str, **env: str) -> tuple[int, str, str]:
    """`parity <args>` in a child forked from this process, its output to files: (exit code, stdout, stderr)."""
    return forked_cli(list(args), ROOT, **env)


def test_goldens_cover_pass_and_drift():
    verdicts = {load(run)["verdict"] for run in RUNS}
    assert verdicts == {"pass", "drift"}
    assert any(load(run).get("diagnosis") for run in RUNS), "a drift golden with a diagnosis"
    assert all("created" not in load(run) for run in RUNS), "goldens carry no timestamp"


@pytest.mark.parametrize("run", RUNS)
def test_console_rendering_matches_golden(run):
    check_golden(GOLDEN / run / "console.txt", console_text(load(run)))


@pytest.mark.parametrize("run", RUNS)
def test_markdown_rendering_matches_golden(run):
    check_golden(GOLDEN / run / "report.md", render_markdown(load(run)))


@pytest.mark.parametrize("run", RUNS)
def test_parity_report_reproduces_the_console_golden(run):
    code, out, err = cli("report", str(GOLDEN / run))
    assert code == (0 if load(run)["verdict"] == "pass" else 1), err
    assert out == (GOLDEN / run / "console.txt").read_text()


@pytest.mark.parametrize("run", RUNS)
def test_parity_report_markdown_prints_report_md(run):
    code, out, err = cli("report", str(GOLDEN / run), "--markdown")
    assert code == (0 if load(run)["verdict"] == "pass" else 1), err
    assert out == (GOLDEN / run / "report.md").read_text()


@pytest.mark.parametrize("run", RUNS)
def test_no_color_output_has_no_escapes_and_fits_80_columns(run):
    # FORCE_COLOR makes rich treat the pipe as a terminal; NO_COLOR must still leave no escape at all.
    _, out, _ = cli("report", str(GOLDEN / run), NO_COLOR="1", FORCE_COLOR="1")
    assert out.strip()
    assert not ANSI.search(out), "escape sequences under NO_COLOR"
    widths = [cell_len(line) for line in out.splitlines()]
    assert max(widths) <= 80, f"a line of {max(widths)} columns"


def test_markdown_has_the_report_sections():
    drift = next(load(r) for r in RUNS if load(r).get("diagnosis") and load(r).get("divergences"))
    text = render_markdown(drift)
    first = text.splitlines()[0]
    assert first.startswith("## parity: DRIFT") and drift["model"] in first and drift["backend"] in first
    for heading in ("### Per-position acceptance", "### Reasons", "### First divergence", "### Diagnosis"):
        assert heading in text
    assert "mean acceptance length" in text and "tokens = eager" in text and "max \\|Δlogprob\\|" in text
    assert drift["diagnosis"]["kind"] in text


def test_run_folder_gets_report_md_and_acceptance_png(tmp_path):
    from parity.report.artifacts import write_run
    from parity.report.writers import RUN_REPORT_WRITERS

    summary = load(RUNS[0])
    out = write_run(tmp_path / "run", summary, {}, extra_writers=RUN_REPORT_WRITERS)
    assert (out / "report.md").read_text() == render_markdown(summary)
    assert (out / "acceptance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"], "no staging folder or temp file left"


def test_acceptance_png_is_written_atomically(tmp_path):
    from parity.report.plot import write_acceptance_png

    path = write_acceptance_png(tmp_path / "acceptance.png", load(RUNS[-1]))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["acceptance.png"]


def test_every_other_diagnosed_mode_gets_a_line_under_the_panel():
    summary = load("drift-reassign-seq-lens")
    first = summary["diagnosis"]
    other = {**first, "mode": "full_and_piecewise", "kind": "STALE_BUFFER", "buffers": ["slot_mapping"], "step": 7}
    summary["diagnoses"] = {first["mode"]: first, "full_and_piecewise": other}
    text = console_text(summary)
    assert text.count("╭─ diagnosis") == 1
    assert "also diagnosed" in text
    assert "full_and_piecewise: STALE_BUFFER(slot_mapping) at step 7" in text
