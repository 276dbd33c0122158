"""Requests and the scheduler that batches them step by step.

Arrivals are staggered by engine step; at most `max_num_seqs` run at once.
Each step first schedules every running decode (1+K tokens), then prefills in
admission order within the token budget: a prompt longer than what is left of
`max_num_batched_tokens` is prefilled in chunks over several steps (chunked
prefill, as vLLM does), so prefills join the running decodes in mixed batches.
Only the last prefill row of a batch can stop before the end of its prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parity.engine.kv_cache import BlockAllocator


@dataclass
class Request:
    req_id: int
    prompt: list[int]
    max_tokens: int
    arrival_step: int = 0
    # state
    tokens: list[int] = field(default_factory=list)   # prompt + output
    drafts: list[int] = field(default_factory=list)   # proposed, awaiting verification
    draft_logprobs: list[float] = field(default_factory=list)
    draft_gaps: list[float] = field(default_factory=list)      # top-1 minus top-2 draft logprob
    draft_probs: object = None                        # [K, V] tensor when sampling
    draft_tree: object = None                         # tree drafts: the `tree.DraftTree` of the drafts
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0                             # prompt tokens already prefilled
    finished: bool = False
    admitted: bool = False

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt)

    @property
    def num_output(self) -> int:
        return len(self.tokens) - len(self.prompt)

    @property
    def output(self) -> list[int]:
        return self.tokens[len(self.prompt):]

    @property
    def prefilled(self) -> bool:
        return self.num_computed >= len(self.prompt)


@dataclass
class ScheduledRow:
    request: Request
    is_prefill: bool
    chunk_start: int = 0          # prefill rows: the prompt positions [chunk_start, chunk_end) of this step
    chunk_end: int = 0

    @property
    def query(self) -> list[int]:
        if self.is_prefill:
            return list(self.request.prompt[self.chunk_start:self.chunk_end])
        return [self.request.tokens[-1]] + list(self.request.drafts)

    @property
    def first_position(self) -> int:
        return self.chunk_start if self.is_prefill else len(self.request.tokens) - 1

    @property
    def partial(self) -> bool:
        """A prefill chunk that stops before the end of its prompt: nothing is sampled for it."""
        return self.is_prefill and self.chunk_end < len(self.request.prompt)


class Scheduler:
    def __init__(self, requests: list[Request], max_num_seqs: int, max_num_batched_tokens: int,
                 allocator: BlockAllocator, positions_ahead: int, max_model_len: int):
        self.waiting = sorted(requests, key=lambda r: (r.arrival_step, r.req_id))
        self.running: list[Request] = []
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.allocator = allocator
        # NOTE: blocks are reserved for the verify query plus every draft step
        # of the step, so the drafter never writes outside the request's blocks.
        self.positions_ahead = positions_ahead
        self.max_model_len = max_model_len

    @property
    def done(self) -> bool:
        return not self.waiting and not self.running

    def schedule(self, step: int) -> list[ScheduledRow]:
        rows = [ScheduledRow(r, False) for r in self.running if r.prefilled]
        budget = self.max_num_batched_tokens - sum(len(r.query) for r in rows)
        for req in self.running:
            if not req.prefilled and budget > 0:
                rows.append(self._chunk(req, budget))
                budget -= len(rows[-1].query)
        while (self.waiting and self.waiting[0].arrival_step <= step
               and len(self.running) < self.max_num_seqs and budget > 0):
            req = self.waiting.pop(0)
            req.admitted = True
            self.running.append(req)
            rows.append(self._chunk(req, budget))
            budget -= len(rows[-1].query)
        for row in rows:
            need = min(self.max_model_len, len(row.request.tokens) + self.positions_ahead)
            self.allocator.ensure(row.request.blocks, need)
        return rows

    @staticmethod
    def _chunk(req: Request, budget: int) -> ScheduledRow:
        end = min(len(req.prompt), req.num_computed + budget)
        return ScheduledRow(req, True, req.num_computed, end)

    def retire_finished(self) -> list[Request]:
        done = [r for r in self.running if r.finished]
        for req in done:
            self.allocator.free(req.blocks)
        self.running = [r for r in self.running if not r.finished]
        return done
