"""The audit at a padded replay: the shadow run sees the graph's shape; padded rows writing where real rows write.

A hand-made engine shaped as nano-vllm is: a global context whose per-step
`slots` hold only the real rows, copied by the engine into the first rows of
the persistent buffer the graph of 4 reads; its forward writes a cache at those
slots and reads them back. CPU through parity.audit.emulated; the `gpu` twin
runs the same checks with torch.cuda (there a padded row's write into a real
row's slot races, and the answer must be the CPU's).
"""

from __future__ import annotations

import pytest
import torch

from parity.audit import audited_graph, emulated
from parity.audit.padded_writes import Recorder, overlap, overlaps, overwrites, routed, targets
from parity.audit.shaped import graph_shaped

TRASH = 7
CONTEXT: dict = {}          # the engine's global context (nano-vllm's `get_context()`)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
aten = torch.ops.aten


class Engine:
    """Graph of 4 rows; `step(n)` replays it for n real rows. bugs: `stale` (slots never copied in), `pad_slot`
    (padded rows keep a real row's slot instead of the trash slot)."""

    def __init__(self, device: str, bugs=()):
        self.device, self.bugs = device, set(bugs)
        gen = torch.Generator().manual_seed(0)
        self.table = torch.randn(16, 4, generator=gen).to(device)
        self.cache = torch.zeros(TRASH + 1, 4, device=device)
        self.tokens = torch.zeros(4, dtype=torch.long, device=device)
        self.slots = torch.full((4,), TRASH, dtype=torch.long, device=device)
        self.num_valid = 4
        G = torch.cuda if device == "cuda" else emulated
        CONTEXT["slots"] = self.slots
        if device == "cuda":            # warm up on a side stream, as torch.cuda.graph wants
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self.forward(self.tokens)
            torch.cuda.current_stream().wait_stream(stream)
            self.cache.zero_()
        self.graph = G.CUDAGraph()
        with audited_graph(self.graph, self.forward, name="Engine.graph[4]", on_mismatch="record",
                           static_inputs={"context": lambda: CONTEXT},
                           num_valid=lambda: self.num_valid) as self.audit:
            self.out = self.audit(self.tokens)

    def forward(self, tokens):
        slots = CONTEXT["slots"]
        x = self.table[tokens]
        self.cache.index_copy_(0, slots, x)
        return self.cache[slots] * 2 + x

    def step(self, tokens: list[int], slots: list[int]) -> torch.Tensor:
        n = len(tokens)
        CONTEXT["slots"] = torch.tensor(slots, device=self.device)       # the real rows only, as nano-vllm's
        self.num_valid = n
        self.tokens[:n] = torch.tensor(tokens, device=self.device)
        if "stale" not in self.bugs:
            self.slots.fill_(slots[0] if "pad_slot" in self.bugs else TRASH)
            self.slots[:n] = CONTEXT["slots"]
        self.graph.replay()
        return self.out[:n].clone()


def _steps(engine: Engine) -> list[torch.Tensor]:
    return [engine.step([1, 2, 3], [0, 1, 2]), engine.step([4, 5, 6], [3, 4, 5]), engine.step([7, 8], [0, 6])]


@pytest.mark.parametrize("device", DEVICES)
def test_a_padded_replay_is_checked_at_the_graphs_shape_and_a_clean_one_gets_nothing(device):
    engine = Engine(device)
    outs = _steps(engine)
    assert engine.audit.replays == 3 and engine.audit.errors == [] and engine.audit.mismatches == 0
    assert CONTEXT["slots"].shape == (2,)          # the engine's own context is back after each shadow run
    assert outs[0].shape == (3, 4)


@pytest.mark.parametrize("device", DEVICES)
def test_a_stale_buffer_is_still_named_at_a_padded_replay(device):
    engine = Engine(device, bugs={"stale"})
    _steps(engine)
    (error,) = engine.audit.errors
    assert (error.kind, error.buffers) == ("STALE_BUFFER", ["self.slots"]), error.diagnosis["evidence"]
    assert "seen at the graph's shape" not in error.diagnosis["experiment"]


@pytest.mark.parametrize("device", DEVICES)
def test_a_padded_row_writing_a_real_rows_slot_is_a_padding_leak_before_any_experiment(device):
    engine = Engine(device, bugs={"pad_slot"})
    _steps(engine)
    assert {e.kind for e in engine.audit.errors} == {"PADDING_LEAK"}, [e.diagnosis for e in engine.audit.errors]
    first = engine.audit.errors[0].diagnosis
    assert first["buffers"] == ["self.slots"] and first["replays"] == 0       # told from indices: no replay
    assert "a real row targets in the same op" in first["evidence"][0]


def test_targets_are_read_from_the_indices_of_each_indexed_write():
    cache, rows = torch.zeros(5, 3, 2), torch.tensor([0, 1, 2, 0])
    positions = torch.tensor([0, 0, 0, 0])
    found = targets(aten.index_put_.default, (cache, [rows, positions], torch.ones(4, 2)), {})
    assert overlap(found[2], 3, 4) == (1, 0)                       # padded row 3 targets (0, 0), as row 0 does
    assert overlap(found[2], 3, 4) is not None and overlap(targets(
        aten.index_put_.default, (cache, [torch.tensor([0, 1, 2, 4]), positions], torch.ones(4, 2)), {})[2],
        3, 4) is None                                              # the trash row: nothing shared
    flat = targets(aten.index_copy_.default, (cache.view(15, 2), 0, torch.tensor([3, 4, 5, 3]),
                                              torch.ones(4, 2)), {})[2]
    assert overlap(flat, 3, 4) == (1, 3)
    history = torch.zeros(4, 8, dtype=torch.long)                  # each row writes its own row: never shared
    flat = targets(aten.scatter_.src, (history, 1, torch.full((4, 1), 2), torch.ones(4, 1, dtype=torch.long)), {})[2]
    assert overlap(flat, 1, 4) is None
    assert targets(aten.add_.Tensor, (cache, cache), {}) is None


def test_a_smaller_live_tensor_is_seen_at_the_captured_shape_with_the_graphs_padding():
    captured = torch.tensor([[9, 9, 9], [9, 9, 9], [-1, -1, -1]])
    shaped = graph_shaped(captured, torch.tensor([[1, 2], [3, 4]]))
    assert shaped.tolist() == [[1, 2, 9], [3, 4, 9], [-1, -1, -1]] and captured[0, 0] == 9
    assert graph_shaped(captured, torch.zeros(4, 3, dtype=torch.long)) is None        # larger: no stand-in
    assert graph_shaped(captured, torch.zeros(2, 3)) is None                          # another dtype
    assert graph_shaped(captured, captured.clone()) is None                           # the same shape


@pytest.mark.parametrize("device", DEVICES)
def test_the_shared_recorder_names_the_index_buffer_a_padded_row_writes_or_a_live_row_reads_through(device):
    """The rules the audit's shadow run and the harness's re-runs share (`padded_writes.Recorder`): a padded row
    (row 3 of 4) writing a live row's element names the write's index; live rows whose index entries agree in
    two runs yet read different values name the read's index, not the tensor read."""
    state, cache = torch.arange(8.0, device=device), torch.zeros(8, device=device)
    rows, slots = torch.tensor([5, 6, 7, 0], device=device), torch.tensor([0, 1, 2, 1], device=device)
    names = {rows.untyped_storage().data_ptr(): "rows", slots.untyped_storage().data_ptr(): "slots"}
    persistent = {state.untyped_storage().data_ptr(): "state", cache.untyped_storage().data_ptr(): "cache"}
    live = lambda index, n: 3 if n == 4 else None   # noqa: E731 (3 live rows of a padded 4)

    def run() -> Recorder:
        with Recorder(names) as recorder:
            cache.index_copy_(0, slots, state.index_select(0, rows))
        return recorder
    first = run()
    assert overwrites(first, live, persistent)[:2] == (["slots"], ["cache"])
    assert [hit for _, hit in overlaps(first, 3, 4)] == [(1, 1)]
    state[5] = float("nan")                          # a live row's element differs between the runs
    assert routed(first, run(), live, persistent)[0] == ["rows"]
    slots[3] = 3                                     # the padded row writes its own element: nothing named
    assert overwrites(run(), live, persistent)[0] == [] and overlaps(run(), 3, 4) == []
