"""The index buffer that routes a padding leak (`parity.audit.padded_writes`'s rules as
`parity.diagnose.routing` hands them the registry, `engine.padding_routes`).

- the two rules on a hand-made forward over a registry (a read through one
  row buffer, a write through another): padded rows writing an element a live
  row writes name the write's index buffer, whatever pad value the registry
  declares (and so do the bisector's stages, from one recorded re-run of the
  reference's forward); live rows whose index entries are the same in two runs
  yet read different values name the read's index buffer; the correct padding
  names nothing;
- the padding probe on the tiny hybrid pair (CPU; CUDA in make test-gpu) with two state-index mistakes
  (issue 34's second-corpus shapes, written here as test-local variants): state
  indices written left-padded name `state_index` (not the state slots read), and
  a registry declaring pad 0 (a live slot) names `spec_index`, also when the
  writes to slot 0 race as on CUDA (a random write order stands in), and
  when the live row's write lands in every run (no value shows it; the
  indices do, at the first probed forward); on the clean engine the reader
  adds no finding.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from parity.audit.padded_writes import Recorder
from parity.diagnose.routing import Routes, overwrite_diagnosis, overwrites, recorder_of, routed
from parity.diagnosis.kinds import PADDING_LEAK
from parity.engine import state_slots
from parity.engine.buffers import INERT, ROW, InputBuffers
from parity.engine.config import EngineConfig
from parity.engine.padding_probe import PaddingProbe
from parity.engine.parts import EngineParts
from parity.engine.spec_decode import SpecDecodeEngine
from parity.engine.state_slots import STATE_FIELDS, StateBuilder
from parity.graphs.factory import install_padded_reference
from parity.models.recurrent import RecurrentMixer
from tests.test_hybrid import CAPTURE_SIZES, CONFIG, hybrid_pair, specs

pytestmark = pytest.mark.xdist_group("hybrid")
SENTINEL = 8
DISPATCH = SimpleNamespace(num_tokens=3, num_tokens_padded=4, num_reqs=3, num_reqs_padded=4)   # 3 live rows of 4


def registry(pad: int, state_index: list[int], spec_index: list[int]) -> InputBuffers:
    buffers = InputBuffers("target", torch.device("cpu"))
    for name, values in (("state_index", state_index), ("spec_index", spec_index)):
        buffers.register(name, (SENTINEL,), torch.int64, ROW, pad, INERT)[:len(values)] = torch.tensor(values)
    return buffers


def step(buffers, state, spec, put: bool = False) -> None:
    """Each row reads its state through state_index and writes a new one through spec_index."""
    rows = DISPATCH.num_reqs_padded
    new = state.index_select(0, buffers["state_index"][:rows]) * 2 + 1
    if put:
        spec[buffers["spec_index"][:rows]] = new
    else:
        spec.index_copy_(0, buffers["spec_index"][:rows], new)


def forward(buffers, state, spec, put: bool = False) -> Recorder:
    """`step`, recorded."""
    with Recorder({t.untyped_storage().data_ptr(): n for n, t in buffers.items()}) as recorder:
        step(buffers, state, spec, put)
    return recorder


def slots() -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Slots 0-2 held by the live rows, 3.. free, the last the sentinel."""
    state = torch.arange(SENTINEL + 1, dtype=torch.float32).repeat_interleave(4).view(-1, 4)
    spec = torch.zeros_like(state)
    return state, spec, {state.untyped_storage().data_ptr(): "state", spec.untyped_storage().data_ptr(): "spec"}


@pytest.mark.parametrize("put", [False, True], ids=["index_copy_", "index_put_"])
def test_padded_rows_writing_a_live_rows_element_name_the_write_index_whatever_the_declared_pad(put):
    state, spec, labels = slots()
    # The registry declares 0 as the pad value: the padded row's entries sit at it, the contract check sees nothing.
    buffers = registry(0, [0, 1, 2, 0], [0, 1, 2, 0])
    names, written, evidence = overwrites(forward(buffers, state, spec, put), buffers, DISPATCH, labels)
    assert names == ["spec_index"] and written == ["spec"]
    assert "padded rows 3..3 of spec_index" in evidence[0] and "(element 0)" in evidence[0]
    clean = registry(SENTINEL, [0, 1, 2, SENTINEL], [0, 1, 2, SENTINEL])
    assert overwrites(forward(clean, state, spec, put), clean, DISPATCH, labels)[0] == []


def two_poisons(buffers) -> tuple[list[str], list[str]]:
    """The forward under two poisons of the slots no live row holds (the sentinel included), read by `routed`."""
    state, spec, labels = slots()
    recorded = []
    for poison in (0.375, -1.25):
        state[3:] = poison
        recorded.append(forward(buffers, state, spec))
    return routed(*recorded, buffers, DISPATCH, labels)


def test_live_rows_routed_to_poisoned_slots_name_the_read_index_not_the_slots():
    names, evidence = two_poisons(registry(SENTINEL, [SENTINEL, 0, 1, 2], [SENTINEL, 0, 1, 2]))    # left-padded
    assert names == ["state_index"] and "row 0 -> element 8" in evidence[0]
    assert two_poisons(registry(SENTINEL, [0, 1, 2, SENTINEL], [0, 1, 2, SENTINEL]))[0] == []
    # a padded row reading a poisoned slot is its own business
    assert two_poisons(registry(SENTINEL, [0, 1, 2, 5], [0, 1, 2, SENTINEL]))[0] == []


class HandLab:
    """The reference standing just after a padded forward (`step`), as the diagnosis stages see it."""

    def __init__(self, buffers):
        owner = SimpleNamespace(buffers=buffers, kv_cache=SimpleNamespace(tensors=lambda: []))
        self.ref, self.ev_r = SimpleNamespace(owner=lambda name: owner), SimpleNamespace(owner="target",
                                                                                          dispatch=DISPATCH)
        self.buffers, (self.state, self.spec, _) = buffers, slots()

    def restore(self, run: str = "graph") -> None:
        self.spec.zero_()

    def run(self, change=None, side: str = "graph") -> None:
        self.restore(side)
        step(self.buffers, self.state, self.spec)

    def diagnosis(self, kind, buffers, **found):
        return SimpleNamespace(kind=kind, buffers=buffers, **found)


def rerun_recorded(lab: HandLab):
    """What the stages do: one re-run of the reference's forward from its pre-state, recorded, then the rule."""
    recorder = recorder_of(lab)
    with recorder:
        lab.run(side="ref")
    return overwrite_diagnosis(lab, recorder)


def test_the_stages_name_padded_rows_writing_over_live_rows_from_one_recorded_rerun():
    found = rerun_recorded(HandLab(registry(0, [0, 1, 2, 0], [0, 1, 2, 0])))
    assert (found.kind, found.buffers) == (PADDING_LEAK, ["spec_index"]) and "indexed writes" in found.experiment
    assert rerun_recorded(HandLab(registry(SENTINEL, [0, 1, 2, SENTINEL], [0, 1, 2, SENTINEL]))) is None


# --- the probe on the tiny hybrid pair ------------------------------------------------------------------------

class LeftPaddedStateIndex(StateBuilder):
    """The state indices written left-padded (the sentinels first), every other row buffer live rows first."""

    def write_state(self, rows, num_tokens, num_tokens_padded, num_reqs_padded):
        slot_ids = [self.slots.slot_for(r.req_id) for r in rows]
        _, pad = self.padding(num_tokens, num_tokens_padded, len(rows), num_reqs_padded)
        for name in STATE_FIELDS:
            self.write(name, [self.slots.sentinel] * pad + slot_ids, 0, num_tokens)


CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                         reason="needs CUDA")])


@pytest.fixture(scope="module", params=["cpu", CUDA])
def pair(request):
    """The tiny hybrid pair on the CPU (make test) and on CUDA (make test-gpu): the same answers on both."""
    return hybrid_pair(device=request.param)


def probe_leaks(pair, parts=None, inert_reads: bool = False, routes=Routes()) -> list:
    """The leaks of the full mode's padded reference, probed with (or, routes=None, without) the routes reader."""
    config = EngineConfig(**CONFIG)
    engine = SpecDecodeEngine(*pair, config, pair[0].lm_head.weight.device, parts or EngineParts())
    probe = PaddingProbe(engine.free_blocks, config.block_size, lambda: engine.step, inert_reads, routes)
    install_padded_reference(engine, "full", CAPTURE_SIZES, probe=probe)
    engine.run(specs(tokens=8))
    return probe.leaks


def test_left_padded_state_indices_name_the_index_that_routes_live_rows_to_the_sentinel(pair):
    parts = EngineParts(target_builder=LeftPaddedStateIndex)
    assert probe_leaks(pair, parts, routes=None)[0].buffers == ["state_slots"]     # the slots read, without it
    leak = probe_leaks(pair, parts)[0]
    # live rows read the sentinel through state_index; and write it through spec_index, as the padded rows do
    assert leak.buffers == ["spec_index", "state_index"] and "overwrite" in leak.kinds, leak
    assert any("state_index routes live rows to poisoned elements" in line for line in leak.evidence)


def test_a_registered_pad_value_naming_a_live_slot_does_not_hide_padded_rows_overwriting_it(pair, monkeypatch):
    register = state_slots.register_state_buffers
    monkeypatch.setattr(state_slots, "register_state_buffers", lambda buffers, rows, sentinel: register(buffers, rows, 0))
    assert all(leak.buffers != ["spec_index"] for leak in probe_leaks(pair, inert_reads=True, routes=None))
    leak = probe_leaks(pair, inert_reads=True)[0]
    # On CUDA the padded and live rows' writes to slot 0 race: a forward whose two poisons then differ is
    # localised too, and other experiments' names may join the one read from the indices.
    assert leak.buffers == ["spec_index"] or pair[0].lm_head.weight.is_cuda and "spec_index" in leak.buffers, leak
    assert "overwrite" in leak.kinds and any("padded rows write over live rows" in line for line in leak.evidence)


def racy_mix(self, x, meta):
    """The mixer with CUDA's `index_copy_` race stood in for: which of two rows writing one slot lands last is a
    fresh draw on every call (the CPU's order is fixed)."""
    states = meta.states
    start = states.state[self.layer_idx].index_select(0, meta.state_index)
    out, ends = self._mix(x, meta.query_start_loc, start, states.positions)
    states.spec[self.layer_idx].index_copy_(0, meta.spec_index, ends)
    order = torch.randperm(ends.shape[0], device=ends.device)
    states.spec[self.layer_idx].index_copy_(0, meta.spec_index[order], ends[order])
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_racing_overwrites_get_the_indices_answer_not_a_lucky_experiments(pair, monkeypatch, seed):
    """With pad 0 declared, padded rows and live row 0 race for slot 0: the two poisons differ by chance, and
    so may every experiment after; what is named is what the indices say, on every draw."""
    register = state_slots.register_state_buffers
    monkeypatch.setattr(state_slots, "register_state_buffers", lambda buffers, rows, sentinel: register(buffers, rows, 0))
    monkeypatch.setattr(RecurrentMixer, "mix", racy_mix)
    torch.manual_seed(seed)
    named = [leak.buffers for leak in probe_leaks(pair) if leak.buffers and leak.owner == "target"]
    assert named and all(buffers == ["spec_index"] for buffers in named), named


def live_wins_mix(self, x, meta):
    """The mixer with CUDA's `index_copy_` race resolved for the live rows on every call: where a padded row and a
    live row write one slot, the live row's write lands (written again after the batch's write)."""
    states = meta.states
    start = states.state[self.layer_idx].index_select(0, meta.state_index)
    out, ends = self._mix(x, meta.query_start_loc, start, states.positions)
    states.spec[self.layer_idx].index_copy_(0, meta.spec_index, ends)
    qsl = meta.query_start_loc
    live = int((qsl[1:] > qsl[:-1]).sum())          # padded rows have no tokens
    states.spec[self.layer_idx].index_copy_(0, meta.spec_index[:live], ends[:live])
    return out


def test_padded_rows_overwriting_a_live_row_are_named_even_when_the_live_write_lands(pair, monkeypatch):
    """Pad 0 declared: padded rows write live row 0's slot. When the live row's write lands in every run (a race
    CUDA may resolve either way), no value shows it; the indices do, at the first probed forward."""
    register = state_slots.register_state_buffers
    monkeypatch.setattr(state_slots, "register_state_buffers",
                        lambda buffers, rows, sentinel: register(buffers, rows, 0))
    monkeypatch.setattr(RecurrentMixer, "mix", live_wins_mix)
    leaks = [leak for leak in probe_leaks(pair) if leak.owner == "target"]
    assert leaks and leaks[0].buffers == ["spec_index"] and leaks[0].kinds == ["overwrite"], leaks
    assert leaks[0].step == 0 and leaks[0].forward == 0, leaks[0]


def test_the_clean_hybrid_engine_gets_no_finding_from_the_routes_reader(pair):
    def found(leaks):
        return [(leak.owner, leak.phase, leak.forward, leak.buffers, leak.kinds) for leak in leaks]
    with_routes = found(probe_leaks(pair, inert_reads=True))
    assert with_routes == found(probe_leaks(pair, inert_reads=True, routes=None))
    assert not any("overwrite" in kinds or "state_index" in names for *_, names, kinds in with_routes)
