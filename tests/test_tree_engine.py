"""Tree drafts in the engine: lossless against greedy decoding, every graph mode at parity, per-depth records.

Greedy speculative decoding is lossless whatever the drafts, so a tree engine
must emit exactly what the engine emits without speculation: a node that
attended to a wrong key, a node embedded at a wrong position or an accepted
path whose KV was not kept changes the target's later tokens. The graph modes
then run on the emulated backend: the same tokens and per-depth records as
eager, the target's logprobs bitwise equal to the mode's padded reference.
"""

from __future__ import annotations

import pytest

from tests.conftest import by_draft, by_token, engine_config, make_specs
from parity.engine.spec_decode import SpecDecodeEngine
from parity.graphs.factory import install_graphs, install_padded_reference

SPECS = make_specs(7, seed=11, max_tokens=12, min_prompt=1, max_prompt=22, stagger=1) \
    + make_specs(2, seed=12, max_tokens=12, min_prompt=2, max_prompt=9, stagger=0)
SPECS = [s.__class__(i, s.prompt, s.max_tokens, s.arrival_step) for i, s in enumerate(SPECS)]
TREES = {"k3-top2-n4": (3, 2, 4), "k3-top3-n7": (3, 3, 7), "k4-top2-n8": (4, 2, 8), "k1-top4-n3": (1, 4, 3)}
MODES = ["piecewise", "full", "full_decode_only", "full_and_piecewise"]
TREE_CFG = dict(num_speculative_tokens=3, topk=3, num_draft_tokens=7, max_num_seqs=4, max_num_batched_tokens=64,
                block_size=4)


def tree_config(steps, topk, nodes, **cfg):
    return engine_config(num_speculative_tokens=steps, topk=topk, num_draft_tokens=nodes, max_num_seqs=3,
                         max_num_batched_tokens=96, **cfg)


@pytest.fixture(scope="module")
def plain(random_pair):
    return SpecDecodeEngine(*random_pair, engine_config(spec_decode=False)).run(SPECS)


@pytest.mark.parametrize("name", list(TREES))
def test_tree_drafts_are_lossless(random_pair, plain, name):
    result = SpecDecodeEngine(*random_pair, tree_config(*TREES[name])).run(SPECS)
    assert result.outputs == plain.outputs
    assert result.free_blocks_at_end == result.total_blocks
    assert result.drafts.accepted.any(), "some nodes are accepted (else nothing was checked past the root)"


def test_per_depth_records_agree_with_the_tokens_emitted(random_pair):
    steps, topk, nodes = TREES["k3-top3-n7"]
    result = SpecDecodeEngine(*random_pair, tree_config(steps, topk, nodes)).run(SPECS)
    drafts = result.drafts
    assert drafts.draft_index.max() < steps
    for (step, req), group in drafts.groupby(["step", "req_id"]):
        n = int(group.num_accepted.iloc[0])
        assert group.accepted.tolist() == [d < n for d in group.draft_index], "accepted: the depths above n"
        assert group.draft_index.tolist() == list(range(len(group))), "one draft per depth, from depth 0"
        accepted = group[group.accepted]
        assert (accepted.draft_token == accepted.target_token).all(), "greedy: an accepted node is the target's"
        emitted = result.tokens[(result.tokens.step == step) & (result.tokens.req_id == req)]
        assert len(emitted) <= n + 1, "the accepted nodes and one token of the target's (fewer at max_tokens)"
        assert emitted.token.tolist()[:n] == accepted.draft_token.tolist()[: len(emitted)]
    rate = drafts.groupby("draft_index").accepted.mean().tolist()
    assert rate == sorted(rate, reverse=True), "acceptance never grows with depth"


def test_chain_and_tree_differ_only_in_how_far_they_get(random_pair, plain):
    chain = SpecDecodeEngine(*random_pair, engine_config(num_speculative_tokens=3, max_num_seqs=3)).run(SPECS)
    tree = SpecDecodeEngine(*random_pair, tree_config(*TREES["k3-top3-n7"])).run(SPECS)
    assert chain.outputs == tree.outputs == plain.outputs
    assert tree.drafts.accepted.sum() / tree.drafts.groupby(["step", "req_id"]).ngroups >= \
        chain.drafts.accepted.sum() / chain.drafts.groupby(["step", "req_id"]).ngroups


@pytest.fixture(scope="module")
def tree_eager(random_pair):
    return SpecDecodeEngine(*random_pair, engine_config(**TREE_CFG)).run(SPECS)


@pytest.mark.parametrize("mode", MODES)
def test_tree_graphs_equal_eager_and_their_padded_reference(random_pair, tree_eager, mode):
    engine = SpecDecodeEngine(*random_pair, engine_config(**TREE_CFG))
    summary = install_graphs(engine, mode, "emulated")
    graphs = engine.run(SPECS)
    reference = SpecDecodeEngine(*random_pair, engine_config(**TREE_CFG))
    install_padded_reference(reference, mode)
    ref = reference.run(SPECS)
    assert sum(summary["graphs"].values()) > 0
    assert graphs.outputs == tree_eager.outputs == ref.outputs
    columns = ["step", "req_id", "draft_index", "draft_token", "accepted"]
    assert by_draft(graphs)[columns].equals(by_draft(tree_eager)[columns])
    g, r = by_token(graphs), by_token(ref)
    assert g.token.tolist() == r.token.tolist()
    assert g.logprob.tolist() == r.logprob.tolist(), "graph logprobs bitwise equal to the padded reference"
    assert by_draft(graphs).target_logprob.tolist() == by_draft(ref).target_logprob.tolist()
    drafted = graphs.forwards[graphs.forwards.phase == "draft_step"]
    assert (drafted.num_tokens == TREE_CFG["topk"] * drafted.num_reqs).all(), "a draft step forwards the frontier"


def cuda_graphs_and_reference(random_pair, mode: str, cfg: dict, specs):
    """`specs` on CUDA: (the run under `mode`'s graphs, the run under its padded reference), on a copy of the pair."""
    import copy

    target, head = copy.deepcopy(random_pair)
    pair = target.to("cuda"), head.to("cuda")
    runs = []
    for reference in (False, True):
        engine = SpecDecodeEngine(*pair, engine_config(**cfg), device="cuda")
        if reference:
            install_padded_reference(engine, mode)
        else:
            assert sum(install_graphs(engine, mode, "cuda")["graphs"].values()) > 0
        runs.append(engine.run(specs))
    return runs


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["piecewise", "full"])
def test_tree_cuda_graphs_equal_their_padded_reference(random_pair, mode):
    """On CUDA the replays are bitwise equal to the padded reference (the same kernels, eagerly)."""
    graphs, ref = cuda_graphs_and_reference(random_pair, mode, TREE_CFG, SPECS)
    assert graphs.outputs == ref.outputs
    assert by_token(graphs).logprob.tolist() == by_token(ref).logprob.tolist()
    assert by_draft(graphs)[["draft_token", "accepted"]].equals(by_draft(ref)[["draft_token", "accepted"]])


@pytest.mark.parametrize("mode, steps, topk, nodes, sizes", [
    ("full_decode_only", 1, 3, 3, [4, 8, 9, 13]),      # K=1: the draft step is captured, never replayed
    ("full_and_piecewise", 2, 3, 5, [4, 6, 10, 21]),   # token-keyed draft steps padded past tokens / topk rows
])
def test_tree_graphs_at_odd_shapes_equal_their_padded_reference(random_pair, mode, steps, topk, nodes, sizes):
    cfg = dict(num_speculative_tokens=steps, topk=topk, num_draft_tokens=nodes, max_num_seqs=2,
               max_num_batched_tokens=2 * (1 + nodes) + 2)
    specs = SPECS[:5]
    eager = SpecDecodeEngine(*random_pair, engine_config(**cfg)).run(specs)
    engine = SpecDecodeEngine(*random_pair, engine_config(**cfg))
    install_graphs(engine, mode, "emulated", capture_sizes=sizes)
    graphs = engine.run(specs)
    reference = SpecDecodeEngine(*random_pair, engine_config(**cfg))
    install_padded_reference(reference, mode, capture_sizes=sizes)
    ref = reference.run(specs)
    assert graphs.outputs == eager.outputs == ref.outputs
    assert by_token(graphs).logprob.tolist() == by_token(ref).logprob.tolist()
    assert "full" in set(graphs.forwards.runtime_mode)


@pytest.mark.slow
def test_eagle_tree_scenario_passes_in_every_mode(tmp_path):
    """scenarios/eagle-tree.yaml (SGLang-like: 5 steps of topk 4, 15 nodes) through `parity run`, the user's path:
    every mode PASS, graphs bitwise equal to their padded references, acceptance reported per depth."""
    import json
    from pathlib import Path

    from tests.robustkit import call, run_args

    scenario = Path(__file__).resolve().parent.parent / "scenarios" / "eagle-tree.yaml"
    code, out, err = call(run_args(scenario, "--out", str(tmp_path / "run"), modes="all"))
    assert code == 0, err[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["modes"]) == {"eager", "piecewise", "full", "full_decode_only", "full_and_piecewise"}
    rates = summary["modes"]["eager"]["acceptance_per_position"]
    assert len(rates) == 5 and None not in rates and rates == sorted(rates, reverse=True) and rates[0] > 0.5, rates
    assert summary["modes"]["eager"]["nodes_per_position"][-1] > 0, "the tiny pair keeps nodes at every depth"
    for mode, run in summary["modes"].items():
        assert run["verdict"] == "pass", mode
        if mode != "eager":
            assert run["reference"]["bitwise_equal"], mode
