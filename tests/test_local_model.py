"""Local checkpoints are never ignored: `--model local` runs them, an embedded --model with paths is refused,
and the report names the folders and a checksum that tells checkpoints apart."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from parity.cli import main
from parity.builders.synth import build as synth
from parity.models.checksum import checkpoint_checksum
from parity.models.pair import load_pair
from parity.builders.synth.spec import SHAPES, SynthRequest
from parity.report.console import render

GOLDEN = Path(__file__).resolve().parent / "golden"
EMBEDDED_CHECKSUM = "a46d1b3624fe37bf"    # tests/golden/*/summary.json and scenarios/baselines pin it


def build(out: Path, seed: int = 0, shape: str = "tiny", head: str = "eagle1") -> tuple[str, str]:
    synth.synthesize(SynthRequest(shape, head, 0.8, "float32", str(out), seed, "cpu"), progress=lambda line: None)
    return str(out / "target"), str(out / head)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Three tiny synth pairs: seed 0, seed 1, and another shape (hidden 64) with seed 0."""
    root = tmp_path_factory.mktemp("local")
    found = {"a": build(root / "a"), "seed1": build(root / "seed1", seed=1)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(SHAPES, "tiny-64", dataclasses.replace(SHAPES["tiny"], name="tiny-64", hidden_size=64, head_dim=16))
        found["shape"] = build(root / "shape", shape="tiny-64")
    return found


def run_cli(capsys, args) -> tuple[int, str]:
    code = main(args)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "bisect", "gate"])
@pytest.mark.parametrize("paths", [("--target-path", "--draft-path"), ("--target-path",), ("--draft-path",)])
def test_paths_with_an_embedded_model_are_refused_with_the_hint(tmp_path, capsys, command, paths):
    args = [command, *[x for flag in paths for x in (flag, str(tmp_path))], "--out", str(tmp_path / "out")]
    code, err = run_cli(capsys, args)
    assert code == 2 and err.count("\n") == 1, err
    assert "embedded model 'tiny-llama3-eagle'" in err and "--model local" in err and paths[0] in err
    assert not (tmp_path / "out").exists()


def test_paths_with_another_embedded_model_are_refused(tmp_path, capsys):
    code, err = run_cli(capsys, ["run", "--model", "tiny-llama3-eagle3", "--target-path", str(tmp_path)])
    assert code == 2 and "'tiny-llama3-eagle3'" in err and "--model local" in err


@pytest.mark.parametrize("paths, missing", [((), "--target-path and --draft-path"),
                                             (("--target-path",), "missing --draft-path"),
                                             (("--draft-path",), "missing --target-path")])
def test_local_needs_both_paths(tmp_path, capsys, paths, missing):
    args = ["run", "--model", "local", *[x for flag in paths for x in (flag, str(tmp_path))]]
    code, err = run_cli(capsys, args)
    assert code == 2 and err.count("\n") == 1 and "--model local needs both" in err and missing in err, err


def test_local_path_without_a_checkpoint_is_named(pairs, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = run_cli(capsys, ["run", "--model", "local", "--target-path", pairs["a"][0], "--draft-path",
                                 str(empty), "--quiet", "--out", str(tmp_path / "out")])
    assert code == 2 and err.count("\n") == 1 and f"--draft-path {empty} holds no config.json" in err, err


def test_local_loads_what_the_paths_hold(pairs):
    target, draft = pairs["a"]
    pair = load_pair("local", target_path=target, draft_path=draft)
    assert pair.name == "local" and str(pair.target_dir) == target and str(pair.draft_dir) == draft


def test_checksums_tell_checkpoints_apart_and_embedded_ones_are_unchanged(pairs):
    sums = {name: checkpoint_checksum(folders) for name, folders in pairs.items()}
    assert len(set(sums.values())) == 3, sums
    assert load_pair("tiny-llama3-eagle").checksum() == EMBEDDED_CHECKSUM


def test_local_runs_end_to_end_and_the_summary_names_the_folders(pairs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    checksums = {}
    for name, modes in (("a", "eager,full"), ("seed1", "eager")):
        target, draft = pairs[name]
        out = tmp_path / name
        code = main(["run", "--model", "local", "--target-path", target, "--draft-path", draft,
                     "--modes", modes, "--backend", "emulated", "--quiet", "--out", str(out)])
        printed = capsys.readouterr().out
        assert code == 0, printed
        summary = json.loads((out / "summary.json").read_text())
        assert summary["model"] == "local" and list(summary["modes"]) == modes.split(",")
        assert summary["target_path"] == str(Path(target).resolve())
        assert summary["draft_path"] == str(Path(draft).resolve())
        assert summary["model_checksum"] == checkpoint_checksum([target, draft])
        assert f"target {summary['target_path']}" in printed and summary["model_checksum"] in printed
        checksums[name] = summary["model_checksum"]
    assert checksums["a"] != checksums["seed1"]


def console_text(summary: dict) -> str:
    console = Console(width=200, no_color=True, record=True, file=io.StringIO())
    render(summary, console=console)
    return console.export_text()


def test_console_names_checkpoints_only_for_models_that_are_not_embedded():
    summary = json.loads((GOLDEN / "pass-default" / "summary.json").read_text())
    assert summary["target_path"] is None                       # embedded: fixed files, goldens unchanged
    assert "target " not in console_text(summary)
    summary.update(target_path="/ckpt/target", draft_path="/ckpt/eagle")
    text = console_text({**summary, "model": "local"})
    assert "target /ckpt/target" in text and "draft  /ckpt/eagle" in text and summary["model_checksum"] in text
