"""parity.audit's public API on small callables (emulated graphs): each experiment, each adapter, each mode."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from parity.audit import (DIAGNOSIS_KEYS, GraphAudit, GraphParityError, audited_graph, emulated, graphed,
                          render_diagnosis)


@dataclass
class Step:
    x: torch.Tensor        # [4, 8]
    pos: torch.Tensor      # [4]


class Toy:
    """A persistent `static` input set, a per-step `inp` the eager path reads, a table, a step counter."""

    def __init__(self):
        gen = torch.Generator().manual_seed(0)
        self.w = torch.randn(8, 8, generator=gen)
        self.table = torch.randn(16, 8, generator=gen)
        self.static = Step(torch.zeros(4, 8), torch.zeros(4, dtype=torch.long))
        self.inp = Step(self.static.x, self.static.pos)
        self.scale = 1

    def forward(self):
        return (self.inp.x @ self.w + self.table[self.inp.pos]) * self.scale

    def feed(self, i: int, copy_pos: bool = True, rebind_pos: bool = False):
        gen = torch.Generator().manual_seed(i + 1)
        self.inp = Step(torch.randn(4, 8, generator=gen), torch.randint(0, 16, (4,), generator=gen))
        self.static.x.copy_(self.inp.x)
        if rebind_pos:
            self.static.pos = self.inp.pos.clone()
        elif copy_pos:
            self.static.pos.copy_(self.inp.pos)


def captured(toy: Toy, **options) -> tuple[GraphAudit, emulated.CUDAGraph]:
    options.setdefault("on_mismatch", "record")
    audit = GraphAudit(toy.forward, name="toy", **options)
    graph = emulated.CUDAGraph()
    with emulated.graph(graph):
        audit()
    return audit, graph


def test_clean_replays_match_and_return_the_outputs():
    toy = Toy()
    audit, graph = captured(toy, on_mismatch="raise")
    for i in range(3):
        toy.feed(i)
        out = audit()
        assert torch.equal(out, toy.forward())
    graph.replay()
    assert audit.replays == 4 and audit.errors == []


@pytest.mark.parametrize("feed, kind, buffer", [
    (dict(copy_pos=False), "STALE_BUFFER", "self.static.pos"),
    (dict(rebind_pos=True), "BUFFER_REASSIGNED", "self.static.pos"),
])
def test_copy_experiments_name_the_buffer(feed, kind, buffer):
    toy = Toy()
    audit, graph = captured(toy)
    toy.feed(0, **feed)
    graph.replay()
    (error,) = audit.errors
    assert error.kind == kind and error.buffers[0] == buffer
    assert error.diagnosis["captured_address"] != error.diagnosis["live_address"]


def test_frozen_host_value_is_found_by_recapture():
    toy = Toy()
    audit, graph = captured(toy)
    toy.feed(0)
    toy.scale = 3
    graph.replay()
    (error,) = audit.errors
    assert (error.kind, error.buffers) == ("FROZEN_AT_CAPTURE", ["self.scale"])
    assert "captured 1" in error.diagnosis["experiment"]


def test_a_rebound_forward_context_is_capture_context_until_it_is_named():
    context = {"bias": torch.ones(8)}

    def get_context():     # a forward-context getter: the walk does not call functions
        return context

    def forward(x):
        return x + get_context()["bias"]

    for static_inputs, kind in ((None, "CAPTURE_CONTEXT"), ({"ctx": get_context}, "BUFFER_REASSIGNED")):
        x = torch.zeros(4, 8)
        context["bias"] = torch.ones(8)
        audit = GraphAudit(forward, name="ctx", static_inputs=static_inputs, on_mismatch="record")
        graph = emulated.CUDAGraph()
        with emulated.graph(graph):
            audit(x)
        context["bias"] = torch.full((8,), 2.0)
        graph.replay()
        assert [e.kind for e in audit.errors] == [kind]
    assert audit.errors[0].buffers == ["static['ctx']['bias']"]


def test_nothing_explains_fresh_randomness():
    x = torch.zeros(4)
    audit = GraphAudit(lambda: x + torch.rand(4), name="rand", on_mismatch="record")
    graph = emulated.CUDAGraph()
    with emulated.graph(graph):
        audit()
    graph.replay()
    (error,) = audit.errors
    assert error.kind == "UNEXPLAINED" and error.diagnosis["experiment"] is None
    assert any("control" in line for line in error.diagnosis["ruled_out"])


def test_padding_leak_through_a_shared_reduction():
    x = torch.randn(4, 8)
    rows = {"n": 3}
    for shared, expected in ((False, []), (True, ["PADDING_LEAK"])):
        def forward():
            return x - (x.amax() if shared else x.amax(-1, keepdim=True))
        audit = GraphAudit(forward, name="pad", num_valid=lambda: rows["n"], static_inputs={"x": x},
                           on_mismatch="record")
        graph = emulated.CUDAGraph()
        with emulated.graph(graph):
            audit()
        x.copy_(torch.randn(4, 8))
        graph.replay()
        assert [e.kind for e in audit.errors] == expected
    # Named as every other check names a tensor: by its shortest path (the closure's `x`, not `static['x']`).
    assert audit.errors[0].buffers == ["x"] and audit.errors[0].diagnosis["rows"] == [0, 1, 2]


def test_raise_mode_and_the_diagnosis_dict():
    toy = Toy()
    audit, graph = captured(toy, on_mismatch="raise")
    toy.feed(0, copy_pos=False)
    with pytest.raises(GraphParityError) as caught:
        graph.replay()
    d = caught.value.diagnosis
    assert list(d) == list(DIAGNOSIS_KEYS) and json.loads(json.dumps(d)) == d
    assert d["mode"] == "full" and d["owner"] == "toy" and d["step"] == 1 and d["replays"] >= 1
    text = render_diagnosis(d)
    assert "STALE_BUFFER" in text and "self.static.pos" in text and "isolated by" in text


def test_every_n_shadow_checks_the_first_and_every_nth_replay(monkeypatch):
    from parity.audit import check
    calls = []
    real = check.shadow
    monkeypatch.setattr(check, "shadow", lambda *a: calls.append(1) or real(*a))
    toy = Toy()
    audit, graph = captured(toy, every=3)
    for i in range(7):
        toy.feed(i)
        graph.replay()
    assert len(calls) == 3          # replays 1, 4, 7


def test_audited_graph_block_and_double_binding():
    toy = Toy()
    graph = emulated.CUDAGraph()
    with audited_graph(graph, toy.forward, name="block", on_mismatch="record") as forward:
        forward()
    toy.feed(0, copy_pos=False)
    graph.replay()
    assert [e.kind for e in forward.errors] == ["STALE_BUFFER"]
    other = GraphAudit(toy.forward, name="other")
    other.record = forward.record
    with pytest.raises(ValueError):
        other.bind(graph)


def test_graphed_decorator_copies_inputs_and_checks():
    w = torch.randn(8, 8)
    settings = {"scale": 1.0}

    @graphed(torch.zeros(4, 8), name="mlp", on_mismatch="record")
    def mlp(x):
        return torch.relu(x @ w) * settings["scale"]

    x = torch.randn(4, 8)
    assert torch.equal(mlp(x), torch.relu(x @ w))
    settings["scale"] = 2.0
    mlp(x)
    assert [(e.kind, e.buffers) for e in mlp.audit.errors] == [("FROZEN_AT_CAPTURE", ["settings['scale']"])]


def test_a_shadow_run_that_raises_leaves_the_replay_state():
    cache = torch.zeros(4)
    state = {"eager_fails": False}

    def forward():
        if state["eager_fails"]:            # Python: seen by the eager run only, never by the replay
            raise RuntimeError("eager failure")
        cache.add_(1.0)
        return cache * 2

    audit = GraphAudit(forward, name="raises")
    graph = emulated.CUDAGraph()
    with emulated.graph(graph):
        audit()
    state["eager_fails"] = True
    with pytest.raises(GraphParityError) as raised:     # a finding, raised as on_mismatch="raise" says
        graph.replay()
    assert "raised RuntimeError: eager failure" in raised.value.diagnosis["evidence"][0]
    assert torch.equal(cache, torch.ones(4))     # the replay's write, nothing from the shadow run


def test_an_enum_is_a_host_value_and_is_never_written_into():
    import enum

    class Mode(enum.Enum):
        FULL = 1
        PIECEWISE = 2

    holder = {"mode": Mode.FULL}
    x = torch.zeros(4)
    audit = GraphAudit(lambda: x + (1.0 if holder["mode"] is Mode.FULL else 2.0), name="enum",
                       static_inputs={"holder": holder}, on_mismatch="record")
    graph = emulated.CUDAGraph()
    with emulated.graph(graph):
        audit()
    holder["mode"] = Mode.PIECEWISE
    graph.replay()
    assert Mode.FULL.value == 1 and Mode.PIECEWISE.value == 2 and holder["mode"] is Mode.PIECEWISE
    assert [(e.kind, e.buffers) for e in audit.errors] == [("FROZEN_AT_CAPTURE", ["holder['mode']"])]


def test_engines_installed_in_site_packages_are_callables():
    from parity.audit.infer import _STDLIB, not_callable
    assert not_callable(f"{_STDLIB}/weakref.py")
    assert not not_callable(f"{_STDLIB}/site-packages/vllm/worker.py")


def test_a_padding_spec_poisons_integer_inputs_too():
    table = torch.randn(16, 8)
    tokens = torch.tensor([1, 2, 3, 4])

    def forward():                       # the padded row's token leaks through a batch-wide mean
        rows = table[tokens]
        return rows - rows.mean(0)

    for padding, expected in ((None, []), ({"tokens": 15}, ["PADDING_LEAK"])):
        audit = GraphAudit(forward, name="ids", num_valid=3, padding=padding, on_mismatch="record")
        graph = emulated.CUDAGraph()
        with emulated.graph(graph):
            audit()
        graph.replay()
        assert [e.kind for e in audit.errors] == expected
    assert audit.errors[0].buffers == ["tokens"]


def test_a_session_block_audits_every_capture_in_it():
    from parity.audit import AuditSession
    toy = Toy()
    session = AuditSession(on_mismatch="record")
    with session.auto():
        graph = emulated.CUDAGraph()
        with emulated.graph(graph):
            toy.forward()
        toy.feed(0, copy_pos=False)
        graph.replay()
    assert [a.name for a in session.audits] == ["Toy.forward()"]
    assert [(e.kind, e.buffers) for e in session.errors] == [("STALE_BUFFER", ["self.static.pos"])]

