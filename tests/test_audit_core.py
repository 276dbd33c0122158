"""The audit's core on the shapes vLLM-like engines have (emulated graphs; small callables).

- inference tensors (no version counter) as inputs, captured and replayed under inference_mode;
- outputs the graph only allocates (`torch.empty`, filled in place after the replay) are not compared;
- eager code writing another graph's output in place between replays is not that graph's pool alias;
- a buffer the graph writes, reallocated after capture, is BUFFER_REASSIGNED by the copy that restores parity;
- the audit observes without disturbing: the second engine computes the same with and without it.
"""

from __future__ import annotations

import pytest
import torch

from parity.audit import GraphAudit, KeyedAudit, emulated
from tests.audit_helpers import audited_run, workload
from tests.second_engine import SpecEngine, load_pair

GRAD_MODES = [torch.no_grad, torch.inference_mode]


class Stepper:
    """Reads `meta.pos` (a view of the persistent `static_pos`, rebuilt per step), writes `cache` in place."""

    def __init__(self):
        gen = torch.Generator().manual_seed(0)
        self.table = torch.randn(16, 8, generator=gen)
        self.static_pos = torch.zeros(4, dtype=torch.long)
        self.cache = torch.zeros(4, 8)
        self.meta = {"pos": self.static_pos}
        self.out_buffer = None

    def forward(self):
        rows = self.table[self.meta["pos"]]
        self.cache.add_(rows)
        attn_out = torch.empty(4, 8)          # filled after the replay, by eager code (vLLM's attention output)
        return rows * 2, attn_out


def capture(fn, pool=None, **options):
    options.setdefault("on_mismatch", "record")
    audit = GraphAudit(fn, name=getattr(fn, "__name__", "fn"), **options)
    graph = emulated.CUDAGraph()
    with emulated.graph(graph, pool=pool):
        out = audit()
    return audit, graph, out


@pytest.mark.parametrize("grad_mode", GRAD_MODES, ids=lambda m: m.__name__)
def test_inference_tensors_are_audited_not_crashed_on(grad_mode):
    with grad_mode():
        s = Stepper()
        audit, graph, _ = capture(s.forward)
        for step in range(3):
            s.meta = {"pos": torch.arange(4) + step}        # BUG: fresh tensor; the persistent one is stale
            graph.replay()
    assert [e.kind for e in audit.errors] == ["STALE_BUFFER"]
    assert audit.errors[0].buffers == ["self.static_pos"]


@pytest.mark.parametrize("grad_mode", GRAD_MODES, ids=lambda m: m.__name__)
def test_memory_the_graph_only_allocates_is_not_compared(grad_mode):
    with grad_mode():
        s = Stepper()
        audit, graph, (_, attn_out) = capture(s.forward, on_mismatch="raise")
        for step in range(3):
            s.static_pos.copy_(torch.arange(4) + step)
            graph.replay()
            attn_out.fill_(step)                       # eager code fills it, as attention does between pieces
    assert audit.errors == [] and audit.mismatches == 0
    assert audit.record.defined[0] is None and not audit.record.defined[1].any()


def test_eager_writes_into_a_live_output_between_replays_are_not_the_next_graphs():
    """Piece A's output buffer, filled in place by eager code, then graph B (another forward) replays."""
    pool = emulated.graph_pool_handle()
    a, b = Stepper(), Stepper()
    audit_a, graph_a, (_, buffer_a) = capture(a.forward, pool=pool, on_mismatch="raise")
    audit_b, graph_b, _ = capture(b.forward, pool=emulated.graph_pool_handle(), on_mismatch="raise")
    for step in range(3):
        graph_a.replay()
        buffer_a.fill_(step + 1)                       # the engine's own write, after A's replay
        graph_b.replay()
    assert audit_a.errors == audit_b.errors == []


def test_a_reallocated_buffer_the_graph_writes_is_reassigned():
    s = Stepper()
    audit, graph, _ = capture(s.forward)
    s.cache = torch.zeros(4, 8)                        # BUG: reallocated after capture; the graph writes the old one
    s.static_pos.copy_(torch.arange(4))
    graph.replay()
    kinds = [(e.kind, e.buffers) for e in audit.errors]
    assert kinds == [("BUFFER_REASSIGNED", ["self.cache"])], [e.diagnosis["evidence"] for e in audit.errors]


@pytest.fixture(scope="module")
def pair():
    return load_pair("cpu")


@pytest.mark.parametrize("bugs", [(), ("pool_alias",), ("frozen",)], ids=lambda b: "+".join(b) or "clean")
def test_the_second_engine_computes_the_same_with_and_without_the_audit(pair, bugs):
    """Experiments included (pool_alias and frozen run re-captures and replays on the live state)."""
    prompts, max_new = workload()
    plain = SpecEngine(*pair, bugs=set(bugs)).generate(prompts, max_new)
    session, _, audited = audited_run(pair, bugs=set(bugs))
    assert bool(session.errors) == bool(bugs)
    assert [(r.out, r.logprobs) for r in audited] == [(r.out, r.logprobs) for r in plain]


def test_a_keyed_audit_runs_eagerly_when_inactive_and_audits_each_key():
    keys, active = [1], [False]
    keyed = KeyedAudit(lambda x: x * 2, key=lambda: keys[0], active=lambda: active[0], name=lambda k: f"f[{k}]",
                       on_mismatch="raise")
    x = torch.ones(4)
    assert torch.equal(keyed(x), x * 2) and keyed.audits == {}
    active[0] = True
    for key in (1, 2):
        keys[0] = key
        graph = emulated.CUDAGraph()
        with emulated.graph(graph):
            keyed(x)
        graph.replay()
    assert [(k, a.name, a.replays) for k, a in keyed.audits.items()] == [(1, "f[1]", 1), (2, "f[2]", 1)]


@pytest.mark.gpu
def test_a_keyed_audit_captured_where_the_audit_cannot_see_fails_loudly():
    keyed = KeyedAudit(lambda x: x * 2, key=lambda: 1, name="f")
    x = torch.ones(4, device="cuda")
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with pytest.raises(RuntimeError, match="auto_audit"):
        with torch.cuda.graph(graph, stream=stream):
            keyed(x)


@pytest.mark.gpu
@pytest.mark.parametrize("view", ["contiguous", "transposed", "strided"])
def test_a_non_owning_alias_of_any_cuda_view_keeps_no_memory(view):
    from parity.audit.aliases import non_owning
    base = torch.randn(64, 32, device="cuda")
    t = {"contiguous": base, "transposed": base.t(), "strided": base[::2, 1::3]}[view]
    alias = non_owning(t)
    assert alias.data_ptr() == t.data_ptr() and alias.stride() == t.stride() and torch.equal(alias, t)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    del base, t
    assert torch.cuda.memory_allocated() < before          # the alias kept nothing
