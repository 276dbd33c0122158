"""parity.audit on real torch.cuda.CUDAGraphs (H100 and the like): the CPU tests' claims, on CUDA.

The second engine graphs by hand with torch.cuda.graph (warm-up and capture on
side streams, one pool for the target, one for the drafter); the audit attaches
by itself through the patched torch.cuda.CUDAGraph and must name each planted
bug with the same kind and role as on the emulated backend.
"""

from __future__ import annotations

import pytest
import torch

from parity.audit import GraphAudit, audited_graph, graphed
from parity.audit.bench import measure_overhead
from tests import test_audit_vllm_recipe as recipe_tests
from tests.audit_helpers import EXPECTED, audited_run, matching, workload
from tests.second_engine import SpecEngine, load_pair

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def pair():
    return load_pair("cuda")


def test_cuda_engine_is_lossless_and_its_graphs_match_eager(pair):
    prompts, max_new = workload()
    eager = SpecEngine(*pair, graphs=False)
    out_eager = eager.generate(prompts, max_new)
    assert [r.out for r in out_eager] == [eager.greedy_reference(p, m) for p, m in zip(prompts, max_new)]
    out_graphed = SpecEngine(*pair).generate(prompts, max_new)
    assert [(r.out, r.logprobs) for r in out_graphed] == [(r.out, r.logprobs) for r in out_eager]


def test_clean_cuda_engine_raises_nothing(pair):
    session, _, _ = audited_run(pair, on_mismatch="raise")
    assert len(session.audits) == 6
    assert session.errors == [] and session.findings == []
    assert all(a.backend.name == "cuda" for a in session.audits)


@pytest.mark.parametrize("bug", sorted(set(EXPECTED) - {"pool_alias"}))
def test_planted_bug_is_named_on_cuda(pair, bug):
    kind, role, graph = EXPECTED[bug]
    session, _, _ = audited_run(pair, bugs={bug})
    assert {e.kind for e in session.errors} == {kind}, [e.diagnosis["evidence"] for e in session.errors]
    assert matching(session, kind, role, graph), [(e.diagnosis["owner"], e.buffers) for e in session.errors]


def test_shared_pool_is_named_on_cuda(pair):
    # NOTE: which graph's output the other's temporaries land on is the caching allocator's choice
    # (on the emulated pool, the verify logits; measured on an H100, the draft token): either way
    # the diagnosis must pair a draft graph with a verify graph.
    session, _, _ = audited_run(pair, bugs={"pool_alias"})
    assert session.errors and {e.kind for e in session.errors} == {"POOL_ALIAS"}
    for d in (e.diagnosis for e in session.errors):
        victim = "('draft'" if "('draft'" in d["owner"] else "('verify'"
        culprit = "('verify'" if victim == "('draft'" else "('draft'"
        assert any(culprit in line for line in d["evidence"]) and d["buffers"], d["evidence"]
    clean = audited_run(pair)[2]
    broken = audited_run(pair, bugs={"pool_alias"})[2]
    print("pool_alias logprobs equal to clean:", [r.logprobs for r in clean] == [r.logprobs for r in broken])


def test_cheap_checks_on_cuda_without_a_shadow_run(pair):
    session, _, _ = audited_run(pair, bugs={"reassigned"}, every=0)
    assert {e.kind for e in session.errors} == {"BUFFER_REASSIGNED"}
    assert session.errors[0].diagnosis["replays"] == 0


def test_audited_torch_cuda_graph_block_names_a_stale_buffer():
    static = {"x": torch.zeros(8, 16, device="cuda")}
    live = {"x": static["x"]}
    w = torch.randn(16, 16, device="cuda")

    def step():
        return torch.relu(live["x"] @ w)

    audit = GraphAudit(step, name="block", static_inputs={"static": static}, on_mismatch="record")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with audited_graph(graph, audit):
        audit()
    live["x"] = torch.randn(8, 16, device="cuda")     # the engine forgets static["x"].copy_(live["x"])
    graph.replay()
    assert [(e.kind, e.buffers) for e in audit.errors] == [("STALE_BUFFER", ["static['static']['x']"])]


def test_graphed_decorator_on_cuda():
    w = torch.randn(16, 16, device="cuda")

    @graphed(torch.zeros(8, 16, device="cuda"), name="mlp", on_mismatch="raise")
    def mlp(x):
        return torch.relu(x @ w)

    x = torch.randn(8, 16, device="cuda")
    assert torch.equal(mlp(x), torch.relu(x @ w))


def test_vllm_recipe_on_cuda():
    undo = recipe_tests.recipe()["audit_cuda_graph_wrapper"](recipe_tests.vllm.CUDAGraphWrapper,
                                                             recipe_tests.vllm.get_forward_context, every=1,
                                                             on_mismatch="record")
    try:
        recipe_tests.test_recipe_audits_each_descriptor_and_names_the_metadata_field(None, device="cuda")
        recipe_tests.test_recipe_on_a_clean_runner_returns_the_eager_values(None, device="cuda")
    finally:
        undo()


def test_measure_overhead_on_cuda():
    result = measure_overhead(iterations=32)
    assert result["backend"] == "cuda" and result["overhead"]["every_1"] > 1.0
    print(result)
