"""The dispatcher: which graph runs a batch, its padded shape, and what gets captured."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.errors import ParityInputError
from parity.graphs.descriptor import BatchDescriptor
from parity.graphs.dispatcher import Dispatcher
from parity.graphs.modes import MODES, default_capture_sizes, runtime_for, validate_capture_sizes

SIZES = (1, 2, 4, 8, 16, 32, 64)
K = 3
Q = K + 1


def target_dispatcher(mode: str, sizes=SIZES, max_num_seqs: int = 6, max_tokens: int = 64) -> Dispatcher:
    return Dispatcher(mode, sizes, max_num_seqs, max_tokens, {"verify": Q})


def drafter_dispatcher(mode: str, sizes=SIZES, max_num_seqs: int = 6, max_tokens: int = 64) -> Dispatcher:
    return Dispatcher(mode, sizes, max_num_seqs, max_tokens, {"draft_prefill": Q, "draft_step": 1})


# --- uniform batches: whole requests -------------------------------------------------

@pytest.mark.parametrize("mode", ["full", "full_decode_only", "full_and_piecewise"])
@pytest.mark.parametrize("num_reqs, padded_reqs", [(1, 1), (2, 2), (3, 4), (4, 4), (5, 6), (6, 6)])
def test_uniform_batch_pads_whole_requests(mode, num_reqs, padded_reqs):
    # max_num_seqs 6: request sizes are the capture sizes below 6, plus 6.
    d = target_dispatcher(mode).dispatch("verify", Q * num_reqs, num_reqs, True)
    assert d.runtime_mode == "full"
    assert (d.num_reqs_padded, d.num_tokens_padded) == (padded_reqs, Q * padded_reqs)
    assert d.descriptor == BatchDescriptor(Q * padded_reqs, padded_reqs, True)
    assert (d.num_tokens, d.num_reqs) == (Q * num_reqs, num_reqs)


def test_draft_steps_are_uniform_with_one_token_per_request():
    d = drafter_dispatcher("full").dispatch("draft_step", 3, 3, True)
    assert d.descriptor == BatchDescriptor(4, 4, True)
    assert (d.num_tokens_padded, d.num_reqs_padded) == (4, 4)


def test_uniform_flag_needs_matching_counts():
    """A batch flagged uniform whose counts are not q per request is dispatched as mixed."""
    d = target_dispatcher("full").dispatch("verify", 13, 3, True)
    assert d.descriptor == BatchDescriptor(16, None, False)


# --- mixed batches: tokens -------------------------------------------------------------

@pytest.mark.parametrize("mode, runtime", [("full", "full"), ("piecewise", "piecewise"),
                                           ("full_and_piecewise", "piecewise")])
@pytest.mark.parametrize("num_tokens, num_reqs, padded", [(1, 1, 1), (3, 2, 4), (13, 3, 16), (33, 5, 64),
                                                          (64, 6, 64)])
def test_mixed_batch_pads_tokens_to_smallest_capture_size(mode, runtime, num_tokens, num_reqs, padded):
    d = target_dispatcher(mode).dispatch("verify", num_tokens, num_reqs, False)
    assert d.runtime_mode == runtime
    assert d.num_tokens_padded == padded
    assert d.num_reqs_padded == min(6, padded)
    assert d.descriptor == BatchDescriptor(padded, None, False)


def test_piecewise_pads_uniform_batches_by_tokens_too():
    d = target_dispatcher("piecewise").dispatch("verify", 12, 3, True)
    assert d.runtime_mode == "piecewise"
    assert d.descriptor == BatchDescriptor(16, None, False)


def test_full_decode_only_runs_mixed_batches_eagerly():
    disp = target_dispatcher("full_decode_only")
    mixed = disp.dispatch("verify", 13, 3, False)
    assert mixed.runtime_mode == "eager" and mixed.descriptor is None
    assert (mixed.num_tokens_padded, mixed.num_reqs_padded) == (13, 3)
    assert not mixed.padded
    assert disp.dispatch("verify", 12, 3, True).runtime_mode == "full"


@pytest.mark.parametrize("mode", ["piecewise", "full", "full_and_piecewise"])
def test_above_largest_capture_size_runs_eager_unpadded(mode):
    disp = target_dispatcher(mode, sizes=(1, 2, 4, 8, 16), max_tokens=100)
    d = disp.dispatch("verify", 17, 2, False)
    assert d.runtime_mode == "eager" and d.descriptor is None
    assert (d.num_tokens_padded, d.num_reqs_padded) == (17, 2)


def test_capture_sizes_above_max_num_batched_tokens_are_dropped():
    disp = target_dispatcher("piecewise", sizes=(1, 8, 32, 64, 128), max_tokens=40)
    assert disp.token_sizes == (1, 8, 32)
    assert disp.dispatch("verify", 33, 2, False).runtime_mode == "eager"


def test_eager_mode_never_pads():
    d = target_dispatcher("eager").dispatch("verify", 12, 3, True)
    assert d.runtime_mode == "eager" and not d.padded and d.descriptor is None


# --- capture plan ---------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["piecewise", "full", "full_decode_only", "full_and_piecewise"])
def test_capture_plan_piecewise_first_then_full_largest_first(mode):
    plan = target_dispatcher(mode).capture_plan("verify", 64)
    assert plan
    runtimes = [p[0] for p in plan]
    assert runtimes == sorted(runtimes, key=lambda r: {"piecewise": 0, "full": 1}[r])
    for runtime in ("piecewise", "full"):
        tokens = [p[2] for p in plan if p[0] == runtime]
        assert tokens == sorted(tokens, reverse=True)
    for runtime, desc, tokens, rows in plan:
        assert desc.num_tokens == tokens
        assert rows == (desc.num_reqs if desc.uniform else min(6, tokens))


def test_capture_plan_contents_full_and_piecewise():
    plan = target_dispatcher("full_and_piecewise").capture_plan("verify", 64)
    assert [(r, d.num_tokens) for r, d, _, _ in plan if r == "piecewise"] == \
        [("piecewise", t) for t in (64, 32, 16, 8, 4, 2, 1)]
    assert [d for r, d, _, _ in plan if r == "full"] == \
        [BatchDescriptor(Q * r, r, True) for r in (6, 4, 2, 1)]


def test_capture_plan_full_decode_only_has_no_token_graphs():
    plan = target_dispatcher("full_decode_only").capture_plan("verify", 64)
    assert all(r == "full" and d.uniform for r, d, _, _ in plan)


def test_capture_plan_stops_at_first_size_covering_max_tokens():
    plan = drafter_dispatcher("piecewise").capture_plan("draft_step", 6)
    assert [d.num_tokens for _, d, _, _ in plan] == [8, 4, 2, 1]


@st.composite
def dispatch_cases(draw):
    sizes = sorted(set(draw(st.lists(st.integers(1, 80), min_size=1, max_size=7))))
    k = draw(st.integers(1, 7))
    max_num_seqs = draw(st.integers(1, 8))
    max_tokens = draw(st.integers(max_num_seqs * (k + 1), 96))
    mode = draw(st.sampled_from(MODES))
    phase = draw(st.sampled_from(["verify", "draft_prefill", "draft_step"]))
    q = 1 if phase == "draft_step" else k + 1
    num_reqs = draw(st.integers(1, max_num_seqs))
    uniform = draw(st.booleans())
    if phase == "draft_step" or uniform:
        num_tokens = q * num_reqs
    else:
        num_tokens = draw(st.integers(num_reqs, max_tokens))
    return tuple(sizes), k, max_num_seqs, max_tokens, mode, phase, num_tokens, num_reqs, uniform


def expected_dispatch(sizes, max_num_seqs, max_tokens, q, mode, num_tokens, num_reqs, uniform):
    """The documented rules, written independently: (runtime, tokens, rows, descriptor)."""
    is_uniform = uniform and num_tokens == q * num_reqs
    runtime = runtime_for(mode, is_uniform)
    token_sizes = [s for s in sizes if s <= max_tokens]
    req_sizes = sorted({s for s in sizes if s < max_num_seqs} | {max_num_seqs})
    if runtime == "full" and is_uniform:
        r = min(s for s in req_sizes if s >= num_reqs)
        return "full", q * r, r, BatchDescriptor(q * r, r, True)
    if runtime == "eager" or not token_sizes or num_tokens > token_sizes[-1]:
        return "eager", num_tokens, num_reqs, None
    t = min(s for s in token_sizes if s >= num_tokens)
    return runtime, t, min(max_num_seqs, t), BatchDescriptor(t, None, False)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(dispatch_cases())
def test_every_dispatch_is_minimal_and_was_captured(case):
    sizes, k, max_num_seqs, max_tokens, mode, phase, num_tokens, num_reqs, uniform = case
    q = {"verify": k + 1, "draft_prefill": k + 1, "draft_step": 1}
    disp = Dispatcher(mode, sizes, max_num_seqs, max_tokens, q)
    d = disp.dispatch(phase, num_tokens, num_reqs, uniform)
    assert (d.phase, d.num_tokens, d.num_reqs) == (phase, num_tokens, num_reqs)
    assert (d.runtime_mode, d.num_tokens_padded, d.num_reqs_padded, d.descriptor) == expected_dispatch(
        sizes, max_num_seqs, max_tokens, q[phase], mode, num_tokens, num_reqs, uniform)
    if d.runtime_mode != "eager":
        phase_max = max_num_seqs if phase == "draft_step" else max_tokens
        plan = {(r, pd) for r, pd, _, _ in disp.capture_plan(phase, phase_max)}
        assert (d.runtime_mode, d.descriptor) in plan, "dispatched to a graph that was never captured"


# --- capture sizes --------------------------------------------------------------------

@pytest.mark.parametrize("sizes", [[], [4, 2], [0, 1, 2], [1, 1, 2], [-3], [1, 2.5], [2, 8, 4]])
def test_validate_capture_sizes_rejects(sizes):
    with pytest.raises(ParityInputError):
        validate_capture_sizes(sizes)


def test_validate_capture_sizes_accepts_increasing_positive():
    assert validate_capture_sizes([1, 3, 7, 20, 64]) == (1, 3, 7, 20, 64)
    assert validate_capture_sizes((5,)) == (5,)


def test_default_capture_sizes():
    assert default_capture_sizes(64) == (1, 2, 4, 8, 16, 32, 64)
    assert default_capture_sizes(48) == (1, 2, 4, 8, 16, 32, 48)
    assert default_capture_sizes(1) == (1,)
