"""Counter-based randomness: every random number is a pure function of
(seed, request id, absolute token position, stream id[, vocab index]).

There is no generator state. Batch composition, row order, padding rows and
graph mode (eager, piecewise, full, emulated) therefore cannot change what a
request draws at a position, which is what makes temperature > 0 runs
comparable across modes (DESIGN.md, "Rejection sampling").

Everything is plain torch tensor arithmetic on int64 with static shapes and no
host reads (.item(), .tolist(), nonzero, branches on tensor values), so it runs
on CPU and CUDA and can be captured in a CUDA graph or by the emulated
backend. ``seed`` and ``stream`` are Python ints fixed for a run: they are
folded into a Python-int constant before any tensor op, so a capture freezes
exactly the value eager uses.

Overflow: torch int64 arithmetic wraps silently (no warning, no error), and a
wrap would make results depend on the backend's overflow behaviour. The hash
keeps every intermediate below 2**63 by construction:

* state words are always masked to 32 bits, so they lie in [0, 2**32);
* a multiplication by a 32-bit constant ``c`` is split into 16-bit halves
  (``_mul32``): ``x * c_lo`` and ``x * c_hi`` are each < 2**32 * 2**16 = 2**48,
  and the recombined sum is < 2**49; the result is then masked to 32 bits, so
  it equals (x * c) mod 2**32 exactly, as in a native uint32 multiply;
* shifts are right shifts of non-negative values, xors and adds of two 32-bit
  values (< 2**33), all far below 2**63.

The mixing function is Chris Wellons' ``triple32`` (hash-prospector, one of
the lowest-bias 32-bit integer hashes known), a bijection on 32-bit words.
Words are absorbed one at a time with a Davies-Meyer-style feed-forward,
``h' = (triple32(h ^ w) + h) mod 2**32``: for a fixed state it is a bijection
in ``w`` (distinct vocab indices of a row never collide), and the ``+ h``
breaks the xor-shift relation a plain ``triple32(h ^ w)`` chain would leave
between two rows (row B's column v equal to row A's column v ^ (hA ^ hB)).
"""

from __future__ import annotations

import torch

__all__ = [
    "STREAM_DRAFT",
    "STREAM_ACCEPT",
    "STREAM_RECOVER",
    "STREAM_BONUS",
    "hash_keys",
    "uniform",
    "gumbel",
    "sample_categorical",
]

# Stream ids: independent sequences for the different uses of randomness at
# one (request, position). Never reuse one stream for two purposes.
STREAM_DRAFT = 1  # the drafter's sample of a speculative token
STREAM_ACCEPT = 2  # the u of the accept test u <= p/q
STREAM_RECOVER = 3  # the resample from norm(max(p - q, 0)) after a rejection
STREAM_BONUS = 4  # the target's sample when every draft was accepted (or a prefill)

_M32 = 0xFFFFFFFF
_M16 = 0xFFFF
# triple32 multipliers (Wellons, hash-prospector); _mul32 splits them in 16-bit halves.
_C1, _C2, _C3 = 0xED5AD4BB, 0xAC4C1B51, 0x31848BAB
_DOMAIN = 0x9E3779B9  # initial state (golden ratio); any fixed 32-bit word


def _mul32(x, c: int):
    """(x * c) mod 2**32 for x in [0, 2**32) and a 32-bit constant c, with
    every intermediate < 2**49 (no int64 overflow). Works on ints and tensors."""
    lo, hi = c & _M16, c >> 16
    return (x * lo + (((x * hi) & _M16) << 16)) & _M32


def _mix32(x):
    """triple32: a 32-bit bijective integer hash. x in [0, 2**32)."""
    x = x ^ (x >> 17)
    x = _mul32(x, _C1)
    x = x ^ (x >> 11)
    x = _mul32(x, _C2)
    x = x ^ (x >> 15)
    x = _mul32(x, _C3)
    x = x ^ (x >> 14)
    return x


def _absorb(h, w):
    """Fold one 32-bit word w into state h (both in [0, 2**32))."""
    return (_mix32(h ^ w) + h) & _M32


def _absorb64(h, w):
    """Fold a (possibly negative) int64 value as two 32-bit words."""
    h = _absorb(h, w & _M32)
    return _absorb(h, (w >> 32) & _M32)


def _scalar_state(seed: int, stream: int) -> int:
    """The Python-int state after seed and stream (a constant for a run)."""
    if isinstance(seed, torch.Tensor) or isinstance(stream, torch.Tensor):
        raise TypeError("seed and stream must be Python ints (fixed for a run)")
    h = _DOMAIN
    h = _absorb64(h, int(seed))
    return _absorb(h, int(stream) & _M32)


def hash_keys(seed: int, req_ids: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """A 32-bit hash per (seed, request id, position, stream), as int64 in
    [0, 2**32). req_ids and positions broadcast together (usually both [N]);
    the result has their broadcast shape and device."""
    h = _scalar_state(seed, stream)
    req = req_ids.to(torch.int64)
    pos = positions.to(torch.int64)
    h = _absorb64(h, req)  # Python-int state ^ tensor -> tensor
    return _absorb64(h, pos)


def _unit(h: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Map 32-bit hashes to the open interval (0, 1).

    float64: (h + 0.5) / 2**32, all 32 bits, in [2**-33, 1 - 2**-33].
    float32: the top 23 bits, (k + 0.5) / 2**23 = (2k + 1) / 2**24, in
    [2**-24, 1 - 2**-24]; every such value is exactly representable in
    float32, so none rounds to 0 or 1 (with 24 bits, k/2**24 + 2**-25 near 1
    would round up to 1.0).
    """
    if dtype == torch.float64:
        return (h.to(torch.float64) + 0.5) * (2.0**-32)
    return ((h >> 9).to(torch.float64) + 0.5).mul(2.0**-23).to(dtype)


def uniform(
    seed: int,
    req_ids: torch.Tensor,
    positions: torch.Tensor,
    stream: int,
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Uniform numbers in the open interval (0, 1), one per (request, position)."""
    return _unit(hash_keys(seed, req_ids, positions, stream), dtype)


def gumbel(
    seed: int,
    req_ids: torch.Tensor,
    positions: torch.Tensor,
    stream: int,
    vocab_size: int,
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Standard Gumbel noise of shape [*broadcast(req_ids, positions), V]:
    one independent draw per (request, position, stream, vocab index).
    Computed in float64 (32-bit uniforms, so the tails reach about +22.2 and
    -3.1) and returned as ``dtype``."""
    rows = hash_keys(seed, req_ids, positions, stream).unsqueeze(-1)
    vocab = torch.arange(vocab_size, device=rows.device, dtype=torch.int64)
    u = _unit(_absorb(rows, vocab), torch.float64)
    return (-torch.log(-torch.log(u))).to(dtype)


def sample_categorical(
    logprobs: torch.Tensor,
    seed: int,
    req_ids: torch.Tensor,
    positions: torch.Tensor,
    stream: int,
) -> torch.Tensor:
    """One sample per row of softmax(logprobs) by the Gumbel-max trick:
    argmax_v(logprobs[v] + G_v) with G_v i.i.d. standard Gumbel is distributed
    exactly as softmax(logprobs). logprobs may be unnormalised log-weights and
    may hold -inf (never chosen while the row has a finite entry).
    logprobs: [*S, V]; req_ids / positions broadcast to S. Returns int64 [*S]."""
    g = gumbel(seed, req_ids, positions, stream, logprobs.shape[-1])
    return (logprobs.to(torch.float32) + g).argmax(dim=-1)
