"""Sampled tree verification (docs/tree.md): each child accepted with the target's probability of its token
exactly, the residual the target's distribution without the children, and every graph mode bitwise equal to its
padded reference at temperature > 0."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import by_draft, by_token, engine_config, make_specs
from tests.test_tree_engine import cuda_graphs_and_reference
from parity.engine.spec_decode import SpecDecodeEngine
from parity.engine.tree import DraftTree
from parity.engine.tree_sampling import accept_sampled, choose_child, residual_logits
from parity.graphs.factory import install_graphs, install_padded_reference

# Dyadic probabilities: a midpoint grid of coins counts each child's acceptance mass exactly.
P = torch.tensor([1, 3, 2, 6, 4], dtype=torch.float64) / 16


def test_each_child_is_accepted_with_its_target_probability_exactly():
    m = 1 << 12
    picks = [choose_child(P, [3, 1], (j + 0.5) / m) for j in range(m)]
    assert picks.count(0) == 6 * m // 16 and picks.count(1) == 3 * m // 16
    assert picks.count(None) == 7 * m // 16            # the rest: the residual's mass, 1 - p(3) - p(1)


def test_the_residual_is_the_target_without_the_children():
    weights = torch.softmax(residual_logits(P.clone(), [3, 1]), dim=-1)
    assert weights[3] == 0 and weights[1] == 0
    assert torch.allclose(weights[[0, 2, 4]], P[[0, 2, 4]] / P[[0, 2, 4]].sum(), rtol=0, atol=1e-15)


def test_a_sure_child_is_always_taken_and_the_walk_goes_on():
    tree = DraftTree((7, 5, 9), (-1, 0, -1), (-0.1, -0.3, -0.2))     # root -> 7 -> 5, root -> 9
    sure = torch.full((4, 12), -1e4)
    sure[0, 7] = sure[1, 5] = sure[2, 3] = 0.0                      # p = 1 on 7 at the root, 5 after it, 3 after 5
    path, last = accept_sampled(tree, sure, 1.0, 0, 0, 10)
    assert path == [0, 1] and last == 3


TREE_CFG = dict(num_speculative_tokens=3, topk=3, num_draft_tokens=7, max_num_seqs=4, max_num_batched_tokens=64,
                block_size=4, temperature=0.8)
SPECS = make_specs(3, seed=21, max_tokens=6, min_prompt=1, max_prompt=12, stagger=1)


def test_sampled_tree_graphs_equal_their_padded_reference(random_pair):
    mode = "full"
    engine = SpecDecodeEngine(*random_pair, engine_config(**TREE_CFG))
    install_graphs(engine, mode, "emulated")
    graphs = engine.run(SPECS)
    reference = SpecDecodeEngine(*random_pair, engine_config(**TREE_CFG))
    install_padded_reference(reference, mode)
    ref = reference.run(SPECS)
    assert graphs.outputs == ref.outputs
    assert by_token(graphs).logprob.tolist() == by_token(ref).logprob.tolist()
    assert by_draft(graphs)[["draft_token", "accepted"]].equals(by_draft(ref)[["draft_token", "accepted"]])
    assert len(by_draft(graphs)) > 0     # (the random pair's flat target accepts little: the scenario shows rates)


@pytest.mark.gpu
def test_sampled_tree_cuda_graphs_equal_their_padded_reference(random_pair):
    graphs, ref = cuda_graphs_and_reference(random_pair, "full", TREE_CFG, SPECS)
    assert graphs.outputs == ref.outputs
    assert by_token(graphs).logprob.tolist() == by_token(ref).logprob.tolist()


@pytest.mark.slow
@pytest.mark.costly
def test_eagle_tree_sampled_scenario_passes_in_every_mode(tmp_path):
    """scenarios/eagle-tree-sampled.yaml through `parity run`: every mode PASS, graphs bitwise equal to their padded
    references, sampled acceptance reported per depth."""
    import json
    from pathlib import Path

    from tests.robustkit import call, run_args

    scenario = Path(__file__).resolve().parent.parent / "scenarios" / "eagle-tree-sampled.yaml"
    code, out, err = call(run_args(scenario, "--out", str(tmp_path / "run"), modes="all"))
    assert code == 0, err[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["temperature"] == 0.8
    assert set(summary["modes"]) == {"eager", "piecewise", "full", "full_decode_only", "full_and_piecewise"}
    assert summary["modes"]["eager"]["acceptance_per_position"][0] > 0
    for mode, run in summary["modes"].items():
        assert run["verdict"] == "pass", mode
        if mode != "eager":
            assert run["reference"]["bitwise_equal"], mode
