"""The speculative-decoding loop: schedule, verify, sample, draft, record.

One engine step: the scheduler picks the running decodes (1+K query tokens
each: the last token and its K drafts) and newly admitted prefills; the target
verifies them in one forward; the rejection sampler emits tokens; the drafter
runs one prefill over the verified tokens and K-1 decode steps, proposing the
next K drafts. Every forward goes through an executor (eager or graphs).

`events()` runs the loop as a generator that pauses around every forward, so a
bisector can drive an eager and a graph engine in lockstep, and returns the
run's records when it ends; `run()` just drains it. `RunEvents` walks such a
generator with a plain `for` and keeps what it returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.engine import sampling, tree_verify
from parity.engine.config import EngineConfig
from parity.engine.kv_cache import BlockAllocator
from parity.engine.metadata import RowPlan
from parity.engine.owner import Owner
from parity.engine.parts import EngineParts
from parity.engine.records import Records, RunResult
from parity.engine.requests import Request, ScheduledRow, Scheduler
from parity.errors import ParityInputError
from parity.graphs.descriptor import Dispatch


@dataclass(frozen=True)
class RequestSpec:
    req_id: int
    prompt: tuple[int, ...]
    max_tokens: int
    arrival_step: int = 0


@dataclass
class ForwardEvent:
    """A pause point of the loop: before ("pre") or after ("post") a forward, or a step's end."""

    kind: str                  # "pre", "post" or "step_end"
    step: int
    index: int                 # forwards run so far in this run (the forward's ordinal)
    phase: str | None = None   # verify, draft_prefill, draft_step
    draft_step: int | None = None
    dispatch: Dispatch | None = None
    meta: object = None
    owner: str | None = None   # the owner's name: "target" or "drafter"
    logits: torch.Tensor | None = None   # the verify output (post verify, step_end)
    num_rows: int = 0
    returned: tuple = ()       # everything the forward returned (post)


class RunEvents:
    """A run's ForwardEvents one by one (`events()`); `result`: the RunResult it returned, once it ended."""

    def __init__(self, events):
        self._events = events
        self.result: RunResult | None = None

    def __iter__(self):
        return self

    def __next__(self) -> ForwardEvent:
        try:
            return next(self._events)
        except StopIteration as end:
            if self.result is None:     # an ended generator ends again with None: keep what it returned
                self.result = end.value
            raise StopIteration from None


def check_admissible(spec: RequestSpec, cfg: EngineConfig) -> None:
    """A request the scheduler could never finish is an input error, not a hang."""
    k = cfg.draft_reach if cfg.spec_decode else 0
    if not spec.prompt:
        raise ParityInputError(f"request {spec.req_id}: empty prompt")
    if len(spec.prompt) + k + 1 > cfg.max_model_len:
        raise ParityInputError(f"request {spec.req_id}: prompt of {len(spec.prompt)} tokens leaves no room "
                               f"for K={k} drafts within max_model_len {cfg.max_model_len}")


class SpecDecodeEngine:
    def __init__(self, target, head, config: EngineConfig, device: torch.device | str = "cpu",
                 parts: EngineParts = EngineParts()):
        self.config = config
        self.device = torch.device(device)
        self.parts = parts
        self.target = parts.target_runner(target, config, self.device, parts.target_builder)
        self.proposer = (parts.proposer(head, config, self.device, parts.drafter_builder)
                         if config.spec_decode else None)
        self._forwards = 0
        self.allocator: BlockAllocator | None = None   # the run's, while it runs
        self.step = 0                                   # the engine step in progress

    def free_blocks(self) -> list[int]:
        """KV blocks no request holds now (none before a run starts)."""
        return self.allocator.free_ids() if self.allocator is not None else []

    @property
    def k(self) -> int:
        return self.config.num_speculative_tokens if self.config.spec_decode else 0

    @property
    def reach(self) -> int:
        """How far past a request's last token one step writes KV (`EngineConfig.draft_reach`)."""
        return self.config.draft_reach if self.config.spec_decode else 0

    @property
    def tree(self) -> bool:
        return self.config.tree and self.config.spec_decode

    def owners(self) -> tuple[Owner, ...]:
        """The target runner and (with speculative decoding) the proposer: all a forward touches."""
        return (self.target,) if self.proposer is None else (self.target, self.proposer)

    def owner(self, name: str) -> Owner:
        return next(o for o in self.owners() if o.name == name)

    # --- the loop -------------------------------------------------------------------

    def run(self, specs: list[RequestSpec], progress=None) -> RunResult:
        """Run every request to completion and return the records."""
        events = RunEvents(self.events(specs, progress))
        for _ in events:
            pass
        return events.result

    @torch.no_grad()
    def events(self, specs: list[RequestSpec], progress=None):
        """The loop as a generator of ForwardEvents that returns the run's RunResult."""
        cfg = self.config
        for s in specs:
            check_admissible(s, cfg)
        allocator = BlockAllocator(cfg.num_blocks, cfg.block_size)
        self.allocator = allocator
        requests = [Request(s.req_id, list(s.prompt), s.max_tokens, s.arrival_step) for s in specs]
        scheduler = Scheduler(requests, cfg.max_num_seqs, cfg.max_num_batched_tokens, allocator,
                              positions_ahead=2 * self.reach + 2, max_model_len=cfg.max_model_len)
        records = self.parts.records()
        self._forwards = 0
        step = 0
        while not scheduler.done:
            rows = scheduler.schedule(step)
            self.step = step
            if rows:
                yield from self._step(step, rows, records)
                finished = scheduler.retire_finished()
                if progress is not None:
                    progress(step, finished)
            step += 1
        frames = records.frames()
        return RunResult(frames["drafts"], frames["tokens"], frames["forwards"],
                         {r.req_id: r.output for r in requests}, step, allocator.num_free, allocator.num_blocks)

    def _step(self, step: int, rows: list[ScheduledRow], records: Records):
        """Verify every row's query, emit tokens, propose the next drafts, record."""
        k, target, tree = self.k, self.target, self.tree
        plans = [RowPlan(r.request.req_id, r.query, r.first_position, r.request.blocks,
                         tree_verify.verify_tree(r.request.draft_tree, r.first_position)
                         if tree and not r.is_prefill else None) for r in rows]
        starts, dispatch, meta = self._verify_batch(rows, plans)
        logits, features = yield from self._forward(step, target, dispatch, meta, None, records, len(rows))
        for row in rows:
            if row.is_prefill:
                row.request.num_computed = row.chunk_end
        if tree:
            emitted, paths = tree_verify.emit(rows, plans, starts, logits, self.config)
            tree_verify.keep_path_kv(target.kv_cache, plans, paths, target.builder.slot_of)
            verified = [r.request.draft_tree for r in rows]
            features, plans = tree_verify.path_first(features, starts, paths), tree_verify.chain_plans(plans)
        else:
            emitted = sampling.emit(rows, plans, starts, logits, self.config, k)
            verified = [(list(r.request.drafts), list(r.request.draft_logprobs), list(r.request.draft_gaps))
                        for r in rows]
        yield from self._draft_and_end(step, rows, plans, starts, emitted, features, records, logits)
        # NOTE: target logprobs are read only now, after the drafter ran, like an
        # engine that copies outputs to the host asynchronously. A drafter that
        # overwrites live target outputs (a shared graph pool) shows up here.
        if tree:
            records.read_logits(tree_verify.step_entries(step, rows, starts, emitted, verified, paths),
                                logits[: starts[-1]])
        else:
            records.record_step(step, rows, starts, emitted, verified, logits, k)
        self._finish(rows)
        target.settle(rows, plans, emitted)

    def _verify_batch(self, rows, plans):
        """The verify forward's query starts, its dispatch (uniform when every row decodes) and its metadata."""
        starts = [0]
        for p in plans:
            starts.append(starts[-1] + p.query_len)
        uniform = all(not r.is_prefill for r in rows) and self.k > 0
        dispatch = self.target.executor.dispatch("verify", starts[-1], len(rows), uniform)
        meta = self.target.builder.build(plans, dispatch.num_tokens_padded, dispatch.num_reqs_padded)
        return starts, dispatch, meta

    def _draft_and_end(self, step, rows, plans, starts, emitted, features, records, logits):
        """The drafter proposes the next tokens (without one, the verified tokens are emitted), then the step ends."""
        if self.proposer is not None:
            yield from self._draft(step, rows, plans, starts, emitted, features, records)
        else:
            for i, row in enumerate(rows):
                row.request.tokens.extend(emitted[i][0])
        yield ForwardEvent("step_end", step, self._forwards, logits=logits, num_rows=len(rows))

    def _draft(self, step, rows, plans, starts, emitted, features, records):
        """Draft prefill over the verified tokens, then K-1 draft decode steps.

        A partial prefill chunk (always the batch's last row) goes through the draft
        prefill, to fill the drafter's KV cache, but proposes nothing: the decode
        steps run over the rows before it.
        """
        proposer = self.proposer
        dispatch, meta = proposer.prepare_prefill(rows, plans, starts, emitted, features)
        yield from self._forward(step, proposer, dispatch, meta, 0, records, len(rows))
        for i, row in enumerate(rows):      # the new sequence's positions from here on
            row.request.tokens.extend(emitted[i][0])
        drafting = [row for row in rows if not row.partial]
        n = len(drafting)
        if n == 0:
            return
        if self.k > 1:
            dispatch, meta = proposer.prepare_steps(drafting)
            for j in range(1, self.k):
                if j > 1:
                    proposer.advance(meta, dispatch)
                yield from self._forward(step, proposer, dispatch, meta, j, records, n)
        if self.tree:
            for row, tree in zip(drafting, proposer.read_trees(n)):
                row.request.draft_tree, row.request.drafts = tree, list(tree.tokens)
            return
        for row, (tokens, logprobs, gaps, probs) in zip(drafting, proposer.read_drafts(n)):
            req = row.request
            req.drafts, req.draft_logprobs, req.draft_gaps, req.draft_probs = tokens, logprobs, gaps, probs

    def _forward(self, step: int, owner: Owner, dispatch: Dispatch, meta, draft_step, records, num_rows):
        """Run one forward of `owner` between a pre and a post event."""
        index, phase = self._forwards, dispatch.phase
        yield ForwardEvent("pre", step, index, phase, draft_step, dispatch, meta, owner.name, num_rows=num_rows)
        out = owner.executor.execute(dispatch, owner.forward(phase).fn, meta)
        self._forwards += 1
        records.log_forward(step, dispatch, draft_step)
        logits = out[0] if out else None
        yield ForwardEvent("post", step, index, phase, draft_step, dispatch, meta, owner.name, logits, num_rows,
                           tuple(out or ()))
        return out

    def _finish(self, rows) -> None:
        """Requests that reached max_tokens (or the end of their context) stop here."""
        for row in rows:
            req = row.request
            if req.num_output >= req.max_tokens or len(req.tokens) + self.reach + 1 > self.config.max_model_len:
                del req.tokens[len(req.prompt) + req.max_tokens:]
                req.finished = True
