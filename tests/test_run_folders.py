"""Run folders are never lost, never overwritten silently and never half-written, and read alike for every user.

Each test names the failure it guards against (found by trying the CLI as a
new user would): two runs in one second sharing a folder, an --out that is a
file or already holds a run, private 0600/0700 modes, a write that fails half
way, a staging folder a killed run left behind.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import stat
import time
from pathlib import Path

import pandas as pd
import pytest

import parity.harness.run_ids as run_ids
from parity.harness.run_ids import default_run_id, slug
from robustkit import call, complete_run, hidden, one_line, run_args, tiny_scenario, visible

FROZEN = dt.datetime(2026, 1, 2, 3, 4, 5)


class _FrozenClock:
    """Stands in for the datetime module in run_ids: every run starts in the same second."""

    class datetime:
        @staticmethod
        def now(tz=None):
            return FROZEN


@pytest.fixture
def frozen_clock(monkeypatch):
    monkeypatch.setattr(run_ids, "_dt", _FrozenClock)


def test_run_ids_of_one_second_differ_and_names_cannot_escape_reports():
    ids = {default_run_id("tiny-llama3-eagle", "default", now=FROZEN) for _ in range(200)}
    assert len(ids) == 200
    assert all(i.startswith("20260102-030405-tiny-llama3-eagle-default-") for i in ids)
    for hostile in ("../../etc/passwd", "a/b\\c", "." * 300, "\x00\n", ""):
        name = slug(hostile)
        assert name and "/" not in name and "\\" not in name and not name.startswith(".") and len(name) <= 60


def test_two_runs_in_the_same_second_get_two_complete_folders(tmp_path, frozen_clock):
    scenario = tiny_scenario(tmp_path)
    printed = []
    for seed in ("1", "2"):
        code, out, err = call(run_args(scenario, "--seed", seed), cwd=tmp_path)
        assert code == 0, err
        printed.append(out.strip().splitlines()[-1])
    folders = visible(tmp_path / "reports")
    assert len(set(printed)) == 2 and len(folders) == 2, (printed, folders)
    assert all(complete_run(f) for f in folders)
    seeds = {json.loads((f / "summary.json").read_text())["seed"] for f in folders}
    assert seeds == {1, 2}


def test_out_that_is_a_file_is_one_line_and_exit_2(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    code, _, err = call(run_args(tiny_scenario(tmp_path), "--out", str(target)))
    assert code == 2 and one_line(err) and "is a file" in err, err
    assert target.read_text() == "mine"


def _fake_run(folder: Path) -> bytes:
    folder.mkdir()
    (folder / "summary.json").write_text('{"verdict": "pass", "modes": {}}\n')
    return (folder / "summary.json").read_bytes()


def test_out_holding_a_run_is_refused_without_force_and_replaced_with_it(tmp_path):
    out = tmp_path / "run"
    before = _fake_run(out)
    scenario = tiny_scenario(tmp_path)
    code, _, err = call(run_args(scenario, "--out", str(out)))
    assert code == 2 and one_line(err) and "--force" in err, err
    assert (out / "summary.json").read_bytes() == before

    code, out_text, err = call(run_args(scenario, "--out", str(out), "--force"))
    assert code == 0, err
    assert complete_run(out) and json.loads((out / "summary.json").read_text())["scenario"] == "tiny"
    assert hidden(tmp_path) == [] and out_text.strip().endswith(f"artifacts: {out}")


def test_force_never_replaces_a_folder_that_is_not_a_run(tmp_path):
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    code, _, err = call(run_args(tiny_scenario(tmp_path), "--out", str(precious), "--force"))
    assert code == 2 and one_line(err) and "not empty" in err, err
    assert (precious / "thesis.tex").read_text() == "years of work"


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_every_artifact_and_the_folder_get_the_umask_modes(tmp_path, umask):
    previous = os.umask(umask)
    try:
        code, _, err = call(run_args(tiny_scenario(tmp_path), "--out", str(tmp_path / "run")))
    finally:
        os.umask(previous)
    assert code == 0, err
    run = tmp_path / "run"
    assert stat.S_IMODE(run.stat().st_mode) == 0o777 & ~umask
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in run.iterdir()}
    assert set(modes) >= {"summary.json", "acceptance.png", "records.parquet", "report.md"}
    assert modes == {name: 0o666 & ~umask for name in modes}, modes


def test_a_failure_while_writing_leaves_no_folder_and_one_line(tmp_path, monkeypatch):
    def disk_full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[0]))

    monkeypatch.setattr(pd.DataFrame, "to_parquet", disk_full)
    code, _, err = call(run_args(tiny_scenario(tmp_path)), cwd=tmp_path)
    assert code == 2 and one_line(err) and "No space left on device" in err, err
    reports = tmp_path / "reports"
    assert visible(reports) == [] and hidden(reports) == []


def test_an_interrupt_while_writing_leaves_no_folder(tmp_path, monkeypatch):
    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, "to_parquet", interrupted)
    code, _, err = call(run_args(tiny_scenario(tmp_path), "--out", str(tmp_path / "run")))
    assert code == 130 and one_line(err) and "interrupted" in err
    assert visible(tmp_path) == [tmp_path / "tiny.yaml"] and hidden(tmp_path) == []


def test_a_stale_staging_folder_is_hidden_refused_by_report_and_cleaned_by_the_next_run(tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    stale, fresh = reports / ".old-run.parity-staging-abc123", reports / ".live-run.parity-staging-def456"
    for leftover in (stale, fresh):
        leftover.mkdir()
        (leftover / "summary.json").write_text(json.dumps({"schema_version": 1, "modes": {}}))
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))

    code, _, err = call(["report", str(stale)])
    assert code == 2 and one_line(err) and "unfinished run folder" in err, err

    code, _, err = call(run_args(tiny_scenario(tmp_path)), cwd=tmp_path)
    assert code == 0, err
    assert not stale.exists(), "a staging folder older than an hour is a killed run's: removed"
    assert fresh.exists(), "a young staging folder may be a live run's: kept"
    assert len(visible(reports)) == 1 and complete_run(visible(reports)[0])


@pytest.mark.parametrize("existing", ["file", "run"])
def test_gate_out_is_checked_before_the_gate_runs(tmp_path, existing):
    out = tmp_path / "gate-run"
    if existing == "file":
        out.write_text("mine")
    else:
        _fake_run(out)
    code, _, err = call(["gate", "--scenario", str(tiny_scenario(tmp_path)), "--backend", "emulated",
                         "--modes", "eager,full", "--out", str(out)])
    assert code == 2 and one_line(err) and ("is a file" in err if existing == "file" else "--force" in err), err
