"""The tree faults of the catalog strike where they should, fast, on the tiny random pair (docs/tree.md).

The mutation matrix runs them through `parity run` on their home scenarios and checks what the diagnosis
names; here only the mechanism: a tree buffer sized without the topk factor fits every real batch (eager is
untouched) and not a FULL graph of max_num_seqs rows of topk nodes; padded frontier rows advanced like live
ones never change eager, and leak into live outputs under the padding probe of a padded reference.
"""

from __future__ import annotations

import pytest

from tests.conftest import by_draft, engine_config, make_specs
from parity.engine.padding_probe import PaddingProbe
from parity.engine.spec_decode import SpecDecodeEngine
from parity.faults import seam
from parity.graphs.capacity import ShortBuffers
from parity.graphs.factory import install_graphs, install_padded_reference

# Wide and shallow: a draft step forwards 3 * 4 = 12 nodes, a verify 3 * (1 + 2) = 9 tokens, the batch 10.
WIDE = dict(num_speculative_tokens=2, topk=4, num_draft_tokens=2, max_num_seqs=3, max_num_batched_tokens=10)
TREE = dict(num_speculative_tokens=3, topk=3, num_draft_tokens=7, max_num_seqs=4, max_num_batched_tokens=64,
            block_size=4)
COLUMNS = ["step", "req_id", "draft_index", "draft_token", "accepted"]


def engine(pair, cfg, faults=(), device="cpu"):
    parts, _ = seam.apply(faults)
    return SpecDecodeEngine(*pair, engine_config(**cfg), parts=parts, device=device)


def on_cuda(pair):
    import copy

    target, head = copy.deepcopy(pair)
    return target.to("cuda"), head.to("cuda")


def test_tree_buffers_without_topk_fit_eager_and_not_a_full_graph(random_pair):
    specs = make_specs(2, seed=3, max_tokens=6, min_prompt=2, max_prompt=8, stagger=1)   # 2 rows: 8 nodes
    fault = ("tree-buffer-without-topk",)
    clean = engine(random_pair, WIDE).run(specs)
    assert by_draft(engine(random_pair, WIDE, fault).run(specs))[COLUMNS].equals(by_draft(clean)[COLUMNS])
    with pytest.raises(ShortBuffers) as short:
        install_graphs(engine(random_pair, WIDE, fault), "full", "emulated")
    assert {s.buffer for s in short.value.shortfalls} == {"tree_seq", "tree_base", "tree_bits"}
    install_graphs(engine(random_pair, WIDE, fault), "piecewise", "emulated")   # token graphs <= the batch: fit


def probed_leaks(pair, specs, faults, mode="full", device="cpu"):
    e = engine(pair, TREE, faults, device)
    probe = PaddingProbe(e.free_blocks, e.config.block_size, lambda: e.step)
    install_padded_reference(e, mode, probe=probe)
    return e.run(specs), probe


def test_padding_advanced_as_live_leaks_only_where_padded(random_pair):
    specs = make_specs(3, seed=5, max_tokens=8, min_prompt=2, max_prompt=10, stagger=0)   # 3 rows pad to 4
    fault = ("tree-padding-attends-live",)
    clean = engine(random_pair, TREE).run(specs)
    assert engine(random_pair, TREE, fault).run(specs).outputs == clean.outputs       # eager never pads
    _, probe = probed_leaks(random_pair, specs, ())
    assert probe.probed > 0 and probe.leaks == []
    _, probe = probed_leaks(random_pair, specs, fault)
    assert probe.leaks and all(leak.phase == "draft_step" for leak in probe.leaks)


@pytest.mark.gpu
def test_tree_buffers_without_topk_refuse_a_full_cuda_graph(random_pair):
    with pytest.raises(ShortBuffers) as short:
        install_graphs(engine(on_cuda(random_pair), WIDE, ("tree-buffer-without-topk",), "cuda"), "full", "cuda")
    assert {s.buffer for s in short.value.shortfalls} == {"tree_seq", "tree_base", "tree_bits"}


@pytest.mark.gpu
def test_padding_advanced_as_live_leaks_on_cuda(random_pair):
    specs = make_specs(3, seed=5, max_tokens=8, min_prompt=2, max_prompt=10, stagger=0)
    pair = on_cuda(random_pair)
    _, probe = probed_leaks(pair, specs, (), device="cuda")
    assert probe.probed > 0 and probe.leaks == []
    _, probe = probed_leaks(pair, specs, ("tree-padding-attends-live",), device="cuda")
    assert probe.leaks and all(leak.phase == "draft_step" for leak in probe.leaks)
