"""parity import: vLLM's Prometheus metrics text and its offline example's printed acceptance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parity.cli import main
from parity.errors import ParityInputError
from parity.importers.vllm import detect_format, load_vllm, parse_example_output, parse_prometheus

DATA = Path(__file__).resolve().parent / "data"


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# --- printed text (examples/offline_inference/eagle.py) ---------------------------------------------

def test_seed_000_text_gives_rates_and_the_printed_length():
    r = load_vllm(DATA / "seed000-piecewise.txt")
    assert r.origin == "vllm-text" and r.label == "seed000-piecewise"
    assert r.rates == (0.77, 0.51, 0.28, 0.13, 0.05, 0.03, 0.03)
    assert r.mean_acceptance_length == 2.82
    assert not r.has_counts and r.num_drafts is None


def test_num_drafts_gives_approximate_counts():
    r = load_vllm(DATA / "seed000-full.txt", num_drafts=100)
    assert r.num_drafts == 100 and r.accepted_per_position == (63, 28, 11, 5, 2, 0, 0)
    assert r.approximate


def test_newer_format_with_printed_num_drafts():
    text = ("total_num_output_tokens: 256\nnum_drafts: 90\nnum_draft_tokens: 630\nnum_accepted_tokens: 162\n"
            "mean acceptance length: 2.80\n" + "".join(f"acceptance at token {i}: {r:.2f}\n" for i, r in
                                                       enumerate([0.77, 0.51, 0.28, 0.13, 0.05, 0.03, 0.03])))
    r = parse_example_output(text, "new.txt")
    assert r.num_drafts == 90 and r.accepted_per_position[0] == round(0.77 * 90) and r.approximate
    assert parse_example_output(text, "new.txt", num_drafts=200).num_drafts == 200   # the option wins


def test_two_runs_in_one_text_file_are_refused():
    text = (DATA / "seed000-piecewise.txt").read_text() + (DATA / "seed000-full.txt").read_text()
    with pytest.raises(ParityInputError, match="again"):
        parse_example_output(text, "both.txt")


def test_text_with_a_missing_position_is_refused():
    with pytest.raises(ParityInputError, match="missing for token position"):
        parse_example_output("acceptance at token 0:0.7\nacceptance at token 2:0.2\n", "gap.txt")


# --- Prometheus -----------------------------------------------------------------------------------

def test_prometheus_sums_engines_and_ignores_created_samples():
    r = load_vllm(DATA / "vllm-metrics.prom")
    assert r.origin == "prometheus" and not r.approximate
    assert r.num_drafts == 100
    assert r.accepted_per_position == (77, 51, 28, 13, 5, 3, 3)
    assert r.mean_acceptance_length == pytest.approx(2.80)


def test_prometheus_without_total_suffix_or_extra_labels():
    text = ("vllm:spec_decode_num_drafts 10\n"
            'vllm:spec_decode_num_accepted_tokens_per_pos{position="0"} 6\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos{position="1"} 3\n')
    assert detect_format(text) == "prometheus"
    r = parse_prometheus(text, "m.txt")
    assert (r.num_drafts, r.accepted_per_position) == (10, (6, 3))


def test_prometheus_positions_missing_against_num_draft_tokens():
    text = ("vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_draft_tokens_total 30\n"
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 6\n')
    with pytest.raises(ParityInputError, match="missing for position"):
        parse_prometheus(text, "m.txt")


def test_prometheus_inconsistent_counts_are_refused():
    text = ("vllm:spec_decode_num_drafts_total 10\n"
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 11\n')
    with pytest.raises(ParityInputError, match="inconsistent"):
        parse_prometheus(text, "m.txt")


@pytest.mark.parametrize("name, message", [
    ("vllm-metrics-truncated.prom", "truncated"),
    ("vllm-metrics-no-spec.prom", "no vllm:spec_decode_"),
])
def test_bad_metrics_files_exit_2_with_one_line(capsys, name, message):
    code, out, err = run_cli(capsys, "import", str(DATA / name))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and name in err


def test_unreadable_and_missing_files_exit_2(capsys, tmp_path):
    binary = tmp_path / "binary.prom"
    binary.write_bytes(b"\xff\xfe\x00garbage\x80")
    for path in (tmp_path / "missing.txt", tmp_path, binary):
        code, out, err = run_cli(capsys, "import", str(path))
        assert code == 2 and err.count("\n") == 1, (path, err)


def test_import_prints_the_record_and_json(capsys):
    code, out, _ = run_cli(capsys, "import", str(DATA / "vllm-metrics.prom"))
    assert code == 0 and "100 drafts" in out and "0.770" in out
    code, out, _ = run_cli(capsys, "import", str(DATA / "seed000-full.txt"), "--num-drafts", "100", "--json")
    data = json.loads(out)
    assert code == 0 and data["num_drafts"] == 100 and data["approximate"] is True
    assert data["accepted_per_position"] == [63, 28, 11, 5, 2, 0, 0]
