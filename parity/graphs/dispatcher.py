"""The dispatcher: which graph (if any) runs a batch, and its padded shape.

Uniform batches (every request has the same query length q: 1+K in verify and
draft prefill, 1 in draft steps) are padded in whole requests to the smallest
captured request count; other batches are padded in tokens to the smallest
capture size, with request rows padded to min(max_num_seqs, tokens). A batch
above the largest size runs eagerly at its own shape.
"""

from __future__ import annotations

from bisect import bisect_left

from parity.graphs.descriptor import BatchDescriptor, Dispatch, eager_dispatch
from parity.graphs.modes import EAGER, FULL, PIECEWISE, fallback_for, runtime_for


class Dispatcher:
    def __init__(self, mode: str, capture_sizes: tuple[int, ...], max_num_seqs: int,
                 max_num_batched_tokens: int, uniform_query_len: dict[str, int]):
        self.mode = mode
        self.token_sizes = tuple(s for s in capture_sizes if s <= max_num_batched_tokens)
        self.req_sizes = tuple(sorted({s for s in capture_sizes if s < max_num_seqs} | {max_num_seqs}))
        self.max_num_seqs = max_num_seqs
        self.uniform_query_len = dict(uniform_query_len)

    def _rows_for(self, num_tokens_padded: int) -> int:
        return min(self.max_num_seqs, num_tokens_padded)

    def _token_dispatch(self, phase: str, runtime: str, num_tokens: int, num_reqs: int) -> Dispatch:
        if runtime == EAGER:
            return eager_dispatch(phase, num_tokens, num_reqs)
        i = bisect_left(self.token_sizes, num_tokens)
        if i == len(self.token_sizes):
            return eager_dispatch(phase, num_tokens, num_reqs)
        t = self.token_sizes[i]
        return Dispatch(phase, runtime, num_tokens, num_reqs, t, self._rows_for(t), BatchDescriptor(t, None, False))

    def dispatch(self, phase: str, num_tokens: int, num_reqs: int, uniform: bool) -> Dispatch:
        q = self.uniform_query_len.get(phase)
        uniform = uniform and q is not None and num_tokens == q * num_reqs
        runtime = runtime_for(self.mode, uniform)
        if runtime == FULL and uniform:
            i = bisect_left(self.req_sizes, num_reqs)
            if i < len(self.req_sizes):
                r = self.req_sizes[i]
                return Dispatch(phase, FULL, num_tokens, num_reqs, q * r, r, BatchDescriptor(q * r, r, True))
            runtime = fallback_for(self.mode)
        return self._token_dispatch(phase, runtime, num_tokens, num_reqs)

    def capture_plan(self, phase: str, max_tokens: int) -> list[tuple[str, BatchDescriptor, int, int]]:
        """(runtime, descriptor, tokens, rows) to capture for `phase`: piecewise first, then full, largest first."""
        q = self.uniform_query_len.get(phase)
        plan = []
        general = fallback_for(self.mode)
        uniform_runtime = runtime_for(self.mode, True)
        # Token-keyed graphs a batch of this phase can reach (the first size >= max_tokens bounds it).
        reachable = [t for t in self.token_sizes if t < max_tokens]
        bigger = [t for t in self.token_sizes if t >= max_tokens]
        reachable += bigger[:1]
        if general in (PIECEWISE, FULL) or uniform_runtime == PIECEWISE:
            runtime = general if general != EAGER else PIECEWISE
            for t in sorted(reachable, reverse=True):
                plan.append((runtime, BatchDescriptor(t, None, False), t, self._rows_for(t)))
        if uniform_runtime == FULL and q is not None:
            for r in sorted(self.req_sizes, reverse=True):
                plan.append((FULL, BatchDescriptor(q * r, r, True), q * r, r))
        order = {PIECEWISE: 0, FULL: 1}
        plan.sort(key=lambda item: (order[item[0]], -item[2]))
        return plan
