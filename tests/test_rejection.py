"""Tests for parity.engine.rng (counter-based randomness) and
parity.engine.rejection (the speculative-decoding rejection sampler)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from parity.engine import rng
from parity.engine.rejection import (
    draft_distribution,
    rejection_sample,
    sample_draft,
    sample_target,
)

try:  # scipy is optional; the fallback table below is exact to 3 decimals
    from scipy.stats import chi2 as _scipy_chi2
except ImportError:  # pragma: no cover - depends on the environment
    _scipy_chi2 = None

ALPHA = 1e-3
# Upper-tail critical values of the chi-square distribution at alpha = 0.001,
# from NIST/SEMATECH e-Handbook of Statistical Methods, section 1.3.6.7.4
# "Critical Values of the Chi-Square Distribution" (column 0.001), and equal
# to scipy.stats.chi2.isf(1e-3, df) rounded to 3 decimals (checked with scipy 1.17).
_CHI2_CRIT_1E3 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458,
                  7: 24.322, 8: 26.124, 9: 27.877, 10: 29.588, 11: 31.264}


def chi2_critical(df: int) -> float:
    if _scipy_chi2 is not None:
        return float(_scipy_chi2.isf(ALPHA, df))
    return _CHI2_CRIT_1E3[df]


def chi2_stat(tokens: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic of observed tokens against probs; returns (stat, df)."""
    V = probs.numel()
    counts = torch.bincount(tokens, minlength=V).double()
    expected = tokens.numel() * probs.double()
    assert float(expected.min()) >= 5, "chi-square needs >= 5 expected per cell"
    return float(((counts - expected) ** 2 / expected).sum()), V - 1


def assert_matches(tokens: torch.Tensor, probs: torch.Tensor) -> None:
    stat, df = chi2_stat(tokens, probs)
    assert stat < chi2_critical(df), f"chi2={stat:.2f} >= crit({df})={chi2_critical(df):.2f}"


# Fixed, arbitrary, clearly different target p and draft q (V = 6).
P0 = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
Q0 = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.25, 0.25])
P1 = torch.tensor([0.05, 0.30, 0.05, 0.30, 0.10, 0.20])
Q1 = torch.tensor([0.30, 0.20, 0.20, 0.10, 0.10, 0.10])
N_TRIALS = 20000
SEED = 1234


def _draw_drafts(qs: list[torch.Tensor], req: torch.Tensor, first_pos: torch.Tensor) -> torch.Tensor:
    """Draft tokens d_i ~ q_i per row, with the drafter's own stream."""
    cols = [rng.sample_categorical(q.log().expand(req.numel(), -1), SEED, req, first_pos + i, rng.STREAM_DRAFT)
            for i, q in enumerate(qs)]
    return torch.stack(cols, dim=1)


def _stochastic_batch(ps, qs, n=N_TRIALS):
    """n independent trials (one request id each) of one fixed (p, q) pair per index.
    temperature 1 and target_logits = log p, so softmax(target_logits) == p."""
    K = len(qs)
    req = torch.arange(n, dtype=torch.int64) + 1000
    first_pos = torch.full((n,), 7, dtype=torch.int64)
    drafts = _draw_drafts(qs, req, first_pos)
    draft_probs = torch.stack(qs).expand(n, K, -1)
    target_logits = torch.stack(ps).log().expand(n, K + 1, -1)
    return drafts, draft_probs, target_logits, req, first_pos


# ---------------------------------------------------------------- rng

_M = 0xFFFFFFFF


def _ref_mix32(x: int) -> int:
    """triple32 with Python big ints (no overflow possible): the reference."""
    x ^= x >> 17
    x = (x * 0xED5AD4BB) & _M
    x ^= x >> 11
    x = (x * 0xAC4C1B51) & _M
    x ^= x >> 15
    x = (x * 0x31848BAB) & _M
    x ^= x >> 14
    return x


def _ref_hash(seed: int, req: int, pos: int, stream: int) -> int:
    def absorb(h, w):
        return (_ref_mix32(h ^ w) + h) & _M

    h = 0x9E3779B9
    for w in (seed & _M, (seed >> 32) & _M, stream & _M,
              req & _M, (req >> 32) & _M, pos & _M, (pos >> 32) & _M):
        h = absorb(h, w)
    return h


def test_hash_matches_bigint_reference_on_extreme_inputs():
    """The int64 tensor hash equals the big-int reference, so no intermediate
    wrapped around, even for extreme and negative ids/positions."""
    big = 2**63 - 1
    reqs = [0, 1, -1, 7, big, -big - 1, 2**32 - 1, 2**32, 123456789012]
    poss = [0, 5, -1, big, -big - 1, 2**31, 2**32 + 3, 17, 99]
    seeds = [0, 1, 2**64 - 1, -5]
    req_t, pos_t = torch.tensor(reqs), torch.tensor(poss)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seed in seeds:
            for stream in (rng.STREAM_DRAFT, rng.STREAM_ACCEPT, rng.STREAM_RECOVER, rng.STREAM_BONUS):
                got = rng.hash_keys(seed, req_t, pos_t, stream)
                assert got.dtype == torch.int64
                assert got.tolist() == [_ref_hash(seed, r, p, stream) for r, p in zip(reqs, poss)]
                assert int(got.min()) >= 0 and int(got.max()) < 2**32


def test_mul32_is_exact_mod_2_32():
    xs = torch.tensor([0, 1, 2**31, 2**32 - 1, 0xDEADBEEF, 12345])
    for c in (0xED5AD4BB, 0xAC4C1B51, 0x31848BAB, 0xFFFFFFFF):
        assert rng._mul32(xs, c).tolist() == [(x * c) & _M for x in xs.tolist()]


def test_streams_are_distinct_constants():
    streams = [rng.STREAM_DRAFT, rng.STREAM_ACCEPT, rng.STREAM_RECOVER, rng.STREAM_BONUS]
    assert len(set(streams)) == 4 and all(isinstance(s, int) for s in streams)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_unit_is_open_interval_at_extreme_hashes(dtype):
    h = torch.tensor([0, 1, 2**31, 2**32 - 2, 2**32 - 1])
    u = rng._unit(h, dtype)
    assert u.dtype == dtype
    assert bool((u > 0).all()) and bool((u < 1).all())


def test_uniform_is_uniform():
    n = 200_000
    req = torch.arange(n)
    u = rng.uniform(SEED, req, req % 97, rng.STREAM_ACCEPT).double()
    assert u.dtype == torch.float64 and bool((u > 0).all()) and bool((u < 1).all())
    # mean 1/2 and variance 1/12, within ~6 standard errors
    assert abs(float(u.mean()) - 0.5) < 6 * math.sqrt(1 / 12 / n)
    assert abs(float(u.var()) - 1 / 12) < 6 * math.sqrt(1 / 180 / n)
    # 10 equal buckets: chi-square with 9 degrees of freedom
    buckets = (u * 10).long().clamp(max=9)
    assert_matches(buckets, torch.full((10,), 0.1))


def test_different_keys_give_different_numbers():
    n = 5000
    req = torch.arange(n)
    pos = torch.full((n,), 11)
    base = rng.uniform(SEED, req, pos, rng.STREAM_ACCEPT, dtype=torch.float64)
    variants = {
        "stream": rng.uniform(SEED, req, pos, rng.STREAM_RECOVER, dtype=torch.float64),
        "seed": rng.uniform(SEED + 1, req, pos, rng.STREAM_ACCEPT, dtype=torch.float64),
        "position": rng.uniform(SEED, req, pos + 1, rng.STREAM_ACCEPT, dtype=torch.float64),
        "request": rng.uniform(SEED, req + 1, pos, rng.STREAM_ACCEPT, dtype=torch.float64),
    }
    for name, other in variants.items():
        assert float((other == base).double().mean()) < 0.001, name
        corr = float(torch.corrcoef(torch.stack([base, other]))[0, 1])
        assert abs(corr) < 0.06, (name, corr)
    # and the same key gives the same number, batch-independently
    again = rng.uniform(SEED, req.flip(0), pos, rng.STREAM_ACCEPT, dtype=torch.float64).flip(0)
    assert torch.equal(again, base)


def test_rng_under_no_grad_and_inference_mode():
    req, pos = torch.arange(8), torch.arange(8)
    ref = rng.gumbel(SEED, req, pos, rng.STREAM_RECOVER, 5)
    with torch.no_grad():
        assert torch.equal(rng.gumbel(SEED, req, pos, rng.STREAM_RECOVER, 5), ref)
    with torch.inference_mode():
        assert torch.equal(rng.gumbel(SEED, req, pos, rng.STREAM_RECOVER, 5), ref)


def test_gumbel_moments_and_shape():
    req = torch.arange(400)
    g = rng.gumbel(SEED, req, req * 3, rng.STREAM_BONUS, 250).double()
    assert g.shape == (400, 250) and bool(torch.isfinite(g).all())
    n = g.numel()
    euler_gamma, var = 0.5772156649015329, math.pi**2 / 6
    assert abs(float(g.mean()) - euler_gamma) < 6 * math.sqrt(var / n)
    assert abs(float(g.var()) - var) < 0.05
    # columns of one row are distinct draws; broadcasting [R,1] x [R,K] works
    assert g[0].unique().numel() == 250
    g2 = rng.gumbel(SEED, req[:3, None], torch.arange(4)[None, :], rng.STREAM_BONUS, 7)
    assert g2.shape == (3, 4, 7)


def test_sample_categorical_matches_softmax():
    logits = torch.tensor([0.3, -1.0, 2.0, 0.0, -0.5, 1.1])
    n = N_TRIALS
    req = torch.arange(n)
    toks = rng.sample_categorical(logits.expand(n, -1), SEED, req, torch.zeros(n, dtype=torch.long),
                                  rng.STREAM_DRAFT)
    assert toks.dtype == torch.int64 and toks.shape == (n,)
    assert_matches(toks, torch.softmax(logits.double(), -1))


def test_sample_categorical_never_picks_minus_inf():
    logits = torch.tensor([-math.inf, 0.0, -math.inf, 3.0])
    toks = rng.sample_categorical(logits.expand(2000, -1), SEED, torch.arange(2000),
                                  torch.zeros(2000, dtype=torch.long), rng.STREAM_BONUS)
    assert set(toks.unique().tolist()) == {1, 3}


# ---------------------------------------------------------------- no host syncs

class _NoHostSync(TorchDispatchMode):
    """Raise on the ops that read a tensor on the host (what a CUDA capture forbids)."""

    FORBIDDEN = {"_local_scalar_dense", "nonzero", "is_nonzero", "masked_select", "unique",
                 "_unique", "_unique2", "unique_dim", "unique_consecutive"}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.FORBIDDEN:
            raise RuntimeError(f"host sync: aten.{name}")
        if name == "index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                   for i in (args[1] if len(args) > 1 else [])):
            raise RuntimeError("host sync: boolean-mask indexing")
        return func(*args, **(kwargs or {}))


def test_sync_detector_has_power():
    with pytest.raises(RuntimeError, match="host sync"):
        with _NoHostSync():
            torch.arange(3).sum().item()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_no_host_sync(temperature):
    R, K, V = 3, 2, 7
    g = torch.Generator().manual_seed(0)
    logits_d = torch.randn(R, K, V, generator=g)
    target = torch.randn(R, K + 1, V, generator=g)
    req, pos = torch.arange(R) + 5, torch.tensor([3, 9, 0])
    with _NoHostSync(), torch.no_grad():
        q = draft_distribution(logits_d.reshape(R * K, V), temperature).reshape(R, K, V)
        d = sample_draft(logits_d.reshape(R * K, V), temperature=temperature, seed=SEED,
                         req_ids=req.repeat_interleave(K), positions=(pos[:, None] + torch.arange(K)).reshape(-1))
        out, n = rejection_sample(d.reshape(R, K), q, target, temperature=temperature, seed=SEED,
                                  req_ids=req, first_positions=pos)
        sample_target(target[:, 0], temperature=temperature, seed=SEED, req_ids=req, positions=pos)
    assert out.shape == (R, K + 1) and n.shape == (R,)


# ---------------------------------------------------------------- greedy

def _logits_with_argmax(argmaxes: list[list[int]], V: int = 5) -> torch.Tensor:
    t = torch.tensor(argmaxes)
    return torch.zeros(*t.shape, V).scatter_(-1, t[..., None], 3.0)


def _greedy(drafts, argmaxes, V=5):
    d = torch.tensor(drafts)
    return rejection_sample(d, None, _logits_with_argmax(argmaxes, V), temperature=0.0, seed=SEED,
                            req_ids=torch.arange(d.shape[0]), first_positions=torch.zeros(d.shape[0], dtype=torch.long))


def test_greedy_all_accepted_emits_bonus():
    out, n = _greedy([[1, 2, 3]], [[1, 2, 3, 4]])
    assert out.tolist() == [[1, 2, 3, 4]] and n.tolist() == [3]


def test_greedy_first_mismatch_emits_target_then_pad():
    out, n = _greedy([[1, 2, 3], [0, 2, 3], [1, 2, 0]],
                     [[1, 4, 3, 4], [1, 2, 3, 4], [1, 2, 3, 0]])
    assert out.tolist() == [[1, 4, -1, -1], [1, -1, -1, -1], [1, 2, 3, -1]]
    assert n.tolist() == [1, 0, 2]


def test_greedy_later_match_after_mismatch_is_not_accepted():
    out, n = _greedy([[0, 2, 3]], [[4, 2, 3, 1]])  # drafts 2,3 match but come after a rejection
    assert out.tolist() == [[4, -1, -1, -1]] and n.tolist() == [0]


@pytest.mark.parametrize("draft,expect,n", [(2, [2, 1], 1), (3, [2, -1], 0)])
def test_greedy_k1(draft, expect, n):
    out, na = _greedy([[draft]], [[2, 1]])
    assert out.tolist() == [expect] and na.tolist() == [n]


def test_greedy_ignores_seed_and_draft_probs():
    d = torch.tensor([[1, 2], [3, 3]])
    t = _logits_with_argmax([[1, 0, 4], [3, 1, 1]])
    kw = dict(temperature=0.0, req_ids=torch.arange(2), first_positions=torch.tensor([4, 8]))
    a = rejection_sample(d, None, t, seed=1, **kw)
    b = rejection_sample(d, torch.rand(2, 2, 5), t, seed=2, **kw)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert a[0].tolist() == [[1, 0, -1], [3, 1, -1]]


def test_greedy_draft_helpers():
    logits = torch.tensor([[0.1, 2.0, -1.0], [5.0, 0.0, 0.0]])
    q = draft_distribution(logits, 0.0)
    assert q.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    kw = dict(temperature=0.0, seed=SEED, req_ids=torch.arange(2), positions=torch.arange(2))
    assert sample_draft(logits, **kw).tolist() == [1, 0]
    assert sample_target(logits, **kw).tolist() == [1, 0]


def test_stochastic_requires_draft_probs():
    with pytest.raises(ValueError):
        rejection_sample(torch.zeros(1, 1, dtype=torch.long), None, torch.zeros(1, 2, 3), temperature=1.0,
                         seed=0, req_ids=torch.zeros(1, dtype=torch.long), first_positions=torch.zeros(1, dtype=torch.long))


# ---------------------------------------------------------------- stochastic: distribution

def test_stochastic_first_token_matches_target_distribution():
    drafts, q, t, req, pos = _stochastic_batch([P0, P1], [Q0])
    out, n = rejection_sample(drafts, q, t, temperature=1.0, seed=SEED, req_ids=req, first_positions=pos)
    assert_matches(out[:, 0], P0)
    # acceptance rate is sum_x min(p(x), q(x)) (= 0.5 here), within 6 standard errors
    beta = float(torch.minimum(P0, Q0).sum())
    rate = float(n.double().mean())
    assert abs(rate - beta) < 6 * math.sqrt(beta * (1 - beta) / N_TRIALS)
    # the bonus (after an accepted draft) is distributed as p_1
    assert_matches(out[n == 1, 1], P1)


def test_stochastic_second_token_given_first_accepted_matches_target():
    drafts, q, t, req, pos = _stochastic_batch([P0, P1, P0], [Q0, Q1])
    out, n = rejection_sample(drafts, q, t, temperature=1.0, seed=SEED, req_ids=req, first_positions=pos)
    assert_matches(out[:, 0], P0)
    assert int((n >= 1).sum()) > 5000
    assert_matches(out[n >= 1, 1], P1)


def test_stochastic_temperature_scales_target():
    T = 0.7
    logits = torch.tensor([0.5, 1.5, -0.3, 0.0, 0.9, -1.2])
    p = torch.softmax(logits / T, -1)
    drafts, q, _, req, pos = _stochastic_batch([P0, P0], [Q0])
    t = logits.expand(N_TRIALS, 2, -1)
    out, _ = rejection_sample(drafts, q, t, temperature=T, seed=SEED, req_ids=req, first_positions=pos)
    assert_matches(out[:, 0], p)


def test_identical_draft_and_target_always_accepts():
    drafts, q, t, req, pos = _stochastic_batch([P0, P1], [P0], n=2000)
    _, n = rejection_sample(drafts, q, t, temperature=1.0, seed=SEED, req_ids=req, first_positions=pos)
    assert bool((n == 1).all())


def test_zero_residual_falls_back_to_target():
    # q = 2p is not a distribution, but it makes max(p - q, 0) all zeros while
    # still rejecting about half the drafts: the recovered token must come from p.
    p = torch.tensor([0.5, 0.5, 0.0, 0.0])
    q = torch.tensor([0.5, 0.5, 0.0, 0.0]) * 2
    R = 2000
    req, pos = torch.arange(R), torch.zeros(R, dtype=torch.long)
    drafts = torch.zeros(R, 1, dtype=torch.long)
    out, n = rejection_sample(drafts, q.expand(R, 1, -1), p.log().expand(R, 2, -1), temperature=1.0,
                              seed=SEED, req_ids=req, first_positions=pos)
    rejected = out[n == 0, 0]
    assert 700 < rejected.numel() < 1300
    assert set(rejected.unique().tolist()) <= {0, 1}
    assert set(rejected.unique().tolist()) == {0, 1}


def test_draft_sampler_matches_draft_distribution():
    logits = torch.tensor([0.2, -0.7, 1.3, 0.0, 0.4, -2.0])
    T = 1.3
    q = draft_distribution(logits[None], T)[0]
    assert torch.allclose(q, torch.softmax(logits / T, -1))
    req = torch.arange(N_TRIALS)
    d = sample_draft(logits.expand(N_TRIALS, -1), temperature=T, seed=SEED, req_ids=req,
                     positions=torch.full((N_TRIALS,), 3))
    assert_matches(d, q)
    tt = sample_target(logits.expand(N_TRIALS, -1), temperature=T, seed=SEED, req_ids=req,
                       positions=torch.full((N_TRIALS,), 3))
    assert_matches(tt, q)


def _loop_reference(d, q, tl, T, seed, req, pos):
    """The spec, one request and one index at a time, straight from the rng primitives."""
    R, K = d.shape
    outs, ns = [], []
    for r in range(R):
        key = dict(req_ids=req[r:r + 1])
        p = torch.softmax(tl[r].float() / T, -1)
        row = []
        for i in range(K):
            at = pos[r:r + 1] + i
            u = float(rng.uniform(seed, positions=at, stream=rng.STREAM_ACCEPT, dtype=torch.float64, **key))
            pd, qd = float(p[i, d[r, i]]), float(q[r, i, d[r, i]])
            if pd > 0 and u <= pd / qd:
                row.append(int(d[r, i]))
                continue
            resid = (p[i] - q[r, i]).clamp_min(0)
            w = resid if float(resid.sum()) > 0 else p[i]
            row.append(int(rng.sample_categorical(w.log()[None], seed, positions=at, stream=rng.STREAM_RECOVER, **key)))
            break
        else:
            row.append(int(sample_target(tl[r, K][None], temperature=T, seed=seed, req_ids=req[r:r + 1],
                                         positions=pos[r:r + 1] + K)))
        ns.append(len(row) - 1)
        outs.append(row + [-1] * (K + 1 - len(row)))
    return torch.tensor(outs), torch.tensor(ns)


@pytest.mark.parametrize("case", range(4))
def test_vectorised_sampler_matches_loop_reference(case):
    """Pins streams and positions: recovered tokens use (req, first_pos + n,
    STREAM_RECOVER), the bonus equals sample_target at first_pos + K."""
    gen = torch.Generator().manual_seed(100 + case)
    R, K, V = 40, 1 + case, 5
    T = [1.0, 0.6, 1.7, 1.0][case]
    dl, tl, req, pos = _random_case(R, K, V, gen)
    tl = tl * 0.4 + dl.mean(1, keepdim=True)  # target close to the draft: long accepted runs occur
    d, out, n = _full_step(dl, tl, req, pos, T)
    q = draft_distribution(dl.reshape(R * K, V), T).reshape(R, K, V)
    ref_out, ref_n = _loop_reference(d, q, tl, T, SEED, req, pos)
    assert torch.equal(n, ref_n) and torch.equal(out, ref_out)
    assert int((n == K).sum()) > 0 and int((n < K).sum()) > 0  # bonus and recovery both exercised


# ---------------------------------------------------------------- the check has power

def _broken_rejection(drafts, q, p, req, pos, mode):
    """K = 1 variants of the sampler with a deliberate bug, built on the same rng."""
    p0, q0 = p[:, 0], q[:, 0]
    d = drafts[:, 0]
    u = rng.uniform(SEED, req, pos, rng.STREAM_ACCEPT, dtype=torch.float64)
    if mode == "always_accept":
        return d
    accept = u * q0.gather(-1, d[:, None])[:, 0] <= p0.gather(-1, d[:, None])[:, 0]
    if mode == "resample_from_p":  # on rejection sample p instead of norm(max(p - q, 0))
        rec = rng.sample_categorical(p0.log(), SEED, req, pos, rng.STREAM_RECOVER)
    elif mode == "residual_q_minus_p":  # the residual with p and q swapped
        rec = rng.sample_categorical((q0 - p0).clamp_min(0).log(), SEED, req, pos, rng.STREAM_RECOVER)
    elif mode == "ratio_inverted":  # accept if u <= q/p
        accept = u * p0.gather(-1, d[:, None])[:, 0] <= q0.gather(-1, d[:, None])[:, 0]
        rec = rng.sample_categorical((p0 - q0).clamp_min(0).log(), SEED, req, pos, rng.STREAM_RECOVER)
    else:
        raise AssertionError(mode)
    return torch.where(accept, d, rec)


@pytest.mark.parametrize("mode", ["always_accept", "resample_from_p", "residual_q_minus_p", "ratio_inverted"])
def test_chi_square_check_rejects_broken_rules(mode):
    drafts, q, t, req, pos = _stochastic_batch([P0, P1], [Q0])
    first = _broken_rejection(drafts, q, t.exp(), req, pos, mode)
    stat, df = chi2_stat(first, P0)
    assert stat > chi2_critical(df), f"{mode}: chi2={stat:.1f} did not detect the bug"


# ---------------------------------------------------------------- determinism

def _random_case(R, K, V, gen):
    draft_logits = torch.randn(R, K, V, generator=gen)
    target_logits = torch.randn(R, K + 1, V, generator=gen) * 1.5
    req = torch.randperm(10_000, generator=gen)[:R]
    pos = torch.randint(0, 500, (R,), generator=gen)
    return draft_logits, target_logits, req, pos


def _full_step(draft_logits, target_logits, req, pos, temperature, seed=SEED):
    R, K, V = draft_logits.shape
    flat = draft_logits.reshape(R * K, V)
    q = draft_distribution(flat, temperature).reshape(R, K, V)
    d = sample_draft(flat, temperature=temperature, seed=seed, req_ids=req.repeat_interleave(K),
                     positions=(pos[:, None] + torch.arange(K)).reshape(-1)).reshape(R, K)
    out, n = rejection_sample(d, q, target_logits, temperature=temperature, seed=seed,
                              req_ids=req, first_positions=pos)
    return d, out, n


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_same_key_same_tokens_whatever_the_batch(temperature):
    gen = torch.Generator().manual_seed(7)
    R, K, V = 12, 3, 4  # small V so that acceptance and rejection both happen
    dl, tl, req, pos = _random_case(R, K, V, gen)
    ref_d, ref_out, ref_n = _full_step(dl, tl, req, pos, temperature)
    assert 0 < int(ref_n.sum()) < R * K  # both outcomes occur

    # permuted rows plus extra, unrelated rows (a bigger, reordered batch)
    edl, etl, ereq, epos = _random_case(5, K, V, torch.Generator().manual_seed(99))
    ereq = ereq + 20_000  # distinct request ids
    perm = torch.randperm(R, generator=gen)
    big = [torch.cat([a[perm], b]) for a, b in ((dl, edl), (tl, etl), (req, ereq), (pos, epos))]
    d2, out2, n2 = _full_step(*big, temperature)
    inv = torch.argsort(perm)
    assert torch.equal(d2[:R][inv], ref_d)
    assert torch.equal(out2[:R][inv], ref_out)
    assert torch.equal(n2[:R][inv], ref_n)

    # one request at a time (batch size 1)
    for r in range(R):
        d1, out1, n1 = _full_step(dl[r:r + 1], tl[r:r + 1], req[r:r + 1], pos[r:r + 1], temperature)
        assert torch.equal(out1[0], ref_out[r]) and torch.equal(n1[0], ref_n[r])

    # sample_target as well
    st_ref = sample_target(tl[:, 0], temperature=temperature, seed=SEED, req_ids=req, positions=pos)
    st_perm = sample_target(tl[perm, 0], temperature=temperature, seed=SEED, req_ids=req[perm], positions=pos[perm])
    assert torch.equal(st_perm[inv], st_ref)


def test_seed_and_position_change_stochastic_output():
    gen = torch.Generator().manual_seed(3)
    dl, tl, req, pos = _random_case(64, 2, 8, gen)
    _, a, _ = _full_step(dl, tl, req, pos, 1.0, seed=1)
    _, b, _ = _full_step(dl, tl, req, pos, 1.0, seed=2)
    _, c, _ = _full_step(dl, tl, req, pos + 1, 1.0, seed=1)
    _, a2, _ = _full_step(dl, tl, req, pos, 1.0, seed=1)
    assert torch.equal(a, a2)
    assert not torch.equal(a, b) and not torch.equal(a, c)


# ---------------------------------------------------------------- invariants (hypothesis)

@settings(max_examples=60, deadline=None)
@given(
    R=st.integers(1, 5),
    K=st.integers(1, 5),
    V=st.integers(2, 9),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    seed=st.integers(-(2**63), 2**64 - 1),
    data_seed=st.integers(0, 2**31 - 1),
    agree=st.floats(0.0, 1.0),
)
def test_output_invariants(R, K, V, temperature, seed, data_seed, agree):
    gen = torch.Generator().manual_seed(data_seed)
    dl, tl, req, pos = _random_case(R, K, V, gen)
    if temperature == 0.0:
        # greedy: make drafts agree with the target argmax with probability `agree`
        rand_d = torch.randint(0, V, (R, K), generator=gen)
        keep = torch.rand(R, K, generator=gen) < agree
        d = torch.where(keep, tl[:, :K].argmax(-1), rand_d)
        q = None
    else:
        flat = dl.reshape(R * K, V)
        q = draft_distribution(flat, temperature).reshape(R, K, V)
        d = sample_draft(flat, temperature=temperature, seed=seed, req_ids=req.repeat_interleave(K),
                         positions=(pos[:, None] + torch.arange(K)).reshape(-1)).reshape(R, K)
    out, n = rejection_sample(d, q, tl, temperature=temperature, seed=seed, req_ids=req, first_positions=pos)

    assert out.shape == (R, K + 1) and out.dtype == torch.int64
    assert n.shape == (R,) and n.dtype == torch.int64
    assert bool(((n >= 0) & (n <= K)).all())
    target_argmax = tl.argmax(-1)
    for r in range(R):
        nr = int(n[r])
        row = out[r].tolist()
        assert row[:nr] == d[r, :nr].tolist()  # accepted prefix equals the draft
        assert 0 <= row[nr] < V  # exactly one emitted target token...
        assert row[nr + 1:] == [-1] * (K - nr)  # ...then padding
        assert sum(t >= 0 for t in row) == nr + 1
        if temperature == 0.0:
            assert row[nr] == int(target_argmax[r, nr])
            if nr < K:
                assert int(d[r, nr]) != int(target_argmax[r, nr])
    again = rejection_sample(d, q, tl, temperature=temperature, seed=seed, req_ids=req, first_positions=pos)
    assert torch.equal(again[0], out) and torch.equal(again[1], n)
