"""The speculative-decoding loop: schedule, verify, sample, draft, record.

One engine step: the scheduler picks the running decodes (1+K query tokens
each: the last token and its K drafts) and newly admitted prefills; the target
verifies them in one forward; the rejection sampler emits tokens; the drafter
runs one prefill over the verified tokens and K-1 decode steps, proposing the
next K drafts. Every forward goes through an executor (eager or graphs).

`events()` runs the loop as a generator that pauses around every forward, so a
bisector can drive an eager and a graph engine in lockstep; `run()` just
drains it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.engine import rejection
from parity.engine.config import EngineConfig
from parity.engine.kv_cache import BlockAllocator
from parity.engine.metadata import RowPlan
from parity.engine.proposer import EagleProposer
from parity.engine.records import Records, RunResult
from parity.engine.requests import Request, ScheduledRow, Scheduler
from parity.engine.target_runner import TargetRunner
from parity.errors import ParityInputError
from parity.graphs.context import forward_context
from parity.graphs.descriptor import Dispatch, EagerExecutor

TOP_K = 5


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
    owner: str | None = None   # "target" or "drafter"
    logits: torch.Tensor | None = None   # the verify output (post verify, step_end)
    num_rows: int = 0


def check_admissible(spec: RequestSpec, cfg: EngineConfig) -> None:
    """A request the scheduler could never finish is an input error, not a hang."""
    k = cfg.num_speculative_tokens if cfg.spec_decode else 0
    if not spec.prompt:
        raise ParityInputError(f"request {spec.req_id}: empty prompt")
    if len(spec.prompt) > cfg.max_num_batched_tokens:
        raise ParityInputError(f"request {spec.req_id}: prompt of {len(spec.prompt)} tokens exceeds "
                               f"max_num_batched_tokens {cfg.max_num_batched_tokens} and can never be scheduled")
    if len(spec.prompt) + k + 1 > cfg.max_model_len:
        raise ParityInputError(f"request {spec.req_id}: prompt of {len(spec.prompt)} tokens leaves no room "
                               f"for K={k} drafts within max_model_len {cfg.max_model_len}")


class SpecDecodeEngine:
    def __init__(self, target, head, config: EngineConfig, device: torch.device | str = "cpu",
                 target_executor=None, drafter_executor=None):
        self.config = config
        self.device = torch.device(device)
        self.target = TargetRunner(target, config, self.device)
        self.proposer = EagleProposer(head, config, self.device) if config.spec_decode else None
        self.target_executor = target_executor or EagerExecutor()
        self.drafter_executor = drafter_executor or EagerExecutor()
        self._forwards = 0

    @property
    def k(self) -> int:
        return self.config.num_speculative_tokens if self.config.spec_decode else 0

    # --- the loop -------------------------------------------------------------------

    def run(self, specs: list[RequestSpec], progress=None) -> RunResult:
        """Run every request to completion and return the records."""
        holder: dict = {}
        for _ in self.events(specs, progress, holder):
            pass
        return holder["result"]

    @torch.no_grad()
    def events(self, specs: list[RequestSpec], progress=None, holder: dict | None = None):
        """The loop as a generator of ForwardEvents; the RunResult lands in holder['result']."""
        cfg = self.config
        for s in specs:
            check_admissible(s, cfg)
        allocator = BlockAllocator(cfg.num_blocks, cfg.block_size)
        requests = [Request(s.req_id, list(s.prompt), s.max_tokens, s.arrival_step) for s in specs]
        scheduler = Scheduler(requests, cfg.max_num_seqs, cfg.max_num_batched_tokens, allocator,
                              positions_ahead=2 * self.k + 2, max_model_len=cfg.max_model_len)
        records = Records()
        self._forwards = 0
        step = 0
        while not scheduler.done:
            rows = scheduler.schedule(step)
            if rows:
                yield from self._step(step, rows, records)
                finished = scheduler.retire_finished()
                if progress is not None:
                    progress(step, finished)
            step += 1
        frames = records.frames()
        result = RunResult(frames["drafts"], frames["tokens"], frames["forwards"],
                           {r.req_id: r.output for r in requests}, step, allocator.num_free,
                           allocator.num_blocks)
        if holder is not None:
            holder["result"] = result

    def _forward(self, step, phase, draft_step, owner, executor, dispatch, meta, fn, records, num_rows):
        """Run one forward between a pre and a post event."""
        index = self._forwards
        yield ForwardEvent("pre", step, index, phase, draft_step, dispatch, meta, owner, num_rows=num_rows)
        with forward_context(meta):
            out = executor.execute(dispatch, fn)
        self._forwards += 1
        self._log(records, step, dispatch, draft_step)
        logits = out[0] if out else None
        yield ForwardEvent("post", step, index, phase, draft_step, dispatch, meta, owner, logits, num_rows)
        return out

    def _step(self, step: int, rows: list[ScheduledRow], records: Records):
        k = self.k
        plans = [RowPlan(r.request.req_id, r.query, r.first_position, r.request.blocks) for r in rows]
        num_tokens = sum(p.query_len for p in plans)
        uniform = all(not r.is_prefill for r in rows) and k > 0
        dispatch = self.target_executor.dispatch("verify", num_tokens, len(rows), uniform)
        meta = self.target.builder.build(plans, dispatch.num_tokens_padded, dispatch.num_reqs_padded)
        logits, features = yield from self._forward(step, "verify", None, "target", self.target_executor,
                                                    dispatch, meta, self.target.forward, records, len(rows))
        starts = [0]
        for p in plans:
            starts.append(starts[-1] + p.query_len)
        emitted = self._sample(rows, plans, starts, logits)
        verified = [(list(r.request.drafts), list(r.request.draft_logprobs)) for r in rows]
        if self.proposer is not None:
            yield from self._draft(step, rows, plans, starts, emitted, features, records)
        else:
            for i, row in enumerate(rows):
                row.request.tokens.extend(emitted[i][0])
        yield ForwardEvent("step_end", step, self._forwards, logits=logits, num_rows=len(rows))
        # NOTE: target logprobs are read only now, after the drafter ran, like an
        # engine that copies outputs to the host asynchronously. A drafter that
        # overwrites live target outputs (a shared graph pool) shows up here.
        self._record(step, rows, starts, emitted, verified, logits, records)

    def _sample(self, rows, plans, starts, logits) -> list[tuple[list[int], int]]:
        """Emitted tokens and number of accepted drafts per row."""
        cfg, k = self.config, self.k
        out: list = [None] * len(rows)
        decode = [i for i, r in enumerate(rows) if not r.is_prefill and k > 0]
        plain = [i for i, r in enumerate(rows) if i not in decode]
        dev = logits.device
        if decode:
            idx = torch.tensor([starts[i] + j for i in decode for j in range(k + 1)], device=dev)
            target_logits = logits[idx].view(len(decode), k + 1, -1)
            drafts = torch.tensor([rows[i].request.drafts for i in decode], device=dev)
            probs = torch.stack([rows[i].request.draft_probs for i in decode]) if cfg.temperature > 0 else None
            req_ids = torch.tensor([plans[i].req_id for i in decode], device=dev)
            first = torch.tensor([len(rows[i].request.tokens) for i in decode], device=dev)
            tokens, accepted = rejection.rejection_sample(
                drafts, probs, target_logits, temperature=cfg.temperature, seed=cfg.seed,
                req_ids=req_ids, first_positions=first)
            tokens, accepted = tokens.tolist(), accepted.tolist()
            for n, i in enumerate(decode):
                out[i] = (tokens[n][: accepted[n] + 1], accepted[n])
        if plain:
            idx = torch.tensor([starts[i + 1] - 1 for i in plain], device=dev)
            req_ids = torch.tensor([plans[i].req_id for i in plain], device=dev)
            positions = torch.tensor([plans[i].seq_len for i in plain], device=dev)
            tokens = rejection.sample_target(logits[idx], temperature=cfg.temperature, seed=cfg.seed,
                                             req_ids=req_ids, positions=positions).tolist()
            for n, i in enumerate(plain):
                out[i] = ([tokens[n]], 0)
        return out

    def _draft(self, step, rows, plans, starts, emitted, features, records):
        """Draft prefill over the verified tokens, then K-1 draft decode steps."""
        k, proposer, executor = self.k, self.proposer, self.drafter_executor
        b = proposer.buffers
        shifted, sample_rows = [], []
        for i, row in enumerate(rows):
            tokens, accepted = emitted[i]
            if row.is_prefill:
                shifted += row.request.prompt[1:] + [tokens[0]]
                sample_rows.append(starts[i + 1] - 1)
            else:
                # EAGLE reads (token at position p+1, target hidden at p): the query
                # shifted left by one; index `accepted` holds the newly sampled token,
                # later entries (rejected drafts, then a pad) are overwritten next step.
                drafts = row.request.drafts
                shifted += (tokens + drafts[accepted + 1:] + [0])[: k + 1]
                sample_rows.append(starts[i] + accepted)
        num_tokens, n = starts[-1], len(rows)
        assert len(shifted) == num_tokens, "draft inputs must line up with the verified tokens"
        uniform = all(not r.is_prefill for r in rows)
        d = executor.dispatch("draft_prefill", num_tokens, n, uniform)
        # NOTE: EAGLE-3's fusion of the target's auxiliary hidden states runs here,
        # eagerly, outside the drafter's graphs (they start from the fused features).
        b["hidden_states"][:num_tokens].copy_(proposer.head.fuse_target_hidden(features[:num_tokens]))
        meta = proposer.builder.build(plans, d.num_tokens_padded, d.num_reqs_padded, input_ids=shifted)
        pad = d.num_reqs_padded - n
        b["sample_indices"][: d.num_reqs_padded].copy_(torch.tensor(sample_rows + [0] * pad))
        b["draft_step"].fill_(0)
        meta.draft_step = 0
        yield from self._forward(step, "draft_prefill", 0, "drafter", executor, d, meta,
                                 proposer.prefill_forward, records, n)
        proposer.after_forward(n)

        # Apply the emitted tokens so positions below are the new sequence's.
        for i, row in enumerate(rows):
            row.request.tokens.extend(emitted[i][0])
        if k > 1:
            decode_plans = [RowPlan(p.req_id, [0], len(r.request.tokens) - 1, r.request.blocks)
                            for p, r in zip(plans, rows)]
            d = executor.dispatch("draft_step", n, n, True)
            meta = proposer.builder.build(decode_plans, d.num_tokens_padded, d.num_reqs_padded,
                                          write_input_ids=False)
            b["draft_step"].fill_(1)
            meta.draft_step = 1
            for j in range(1, k):
                if j > 1:
                    proposer.advance(meta, d.num_reqs_padded)
                yield from self._forward(step, "draft_step", j, "drafter", executor, d, meta,
                                         proposer.step_forward, records, n)
                proposer.after_forward(n)
        tokens = b["draft_tokens"][:n].tolist()
        logprobs = b["draft_logprobs"][:n].tolist()
        probs = b["draft_probs"][:n].clone() if self.config.temperature > 0 else None
        for i, row in enumerate(rows):
            row.request.drafts = tokens[i]
            row.request.draft_logprobs = logprobs[i]
            row.request.draft_probs = probs[i] if probs is not None else None

    def _record(self, step, rows, starts, emitted, verified, logits, records: Records) -> None:
        cfg, k = self.config, self.k
        logprobs = torch.log_softmax(logits[: starts[-1]].float(), dim=-1)
        top_lp, top_ids = logprobs.topk(TOP_K, dim=-1)
        top_lp, top_ids = top_lp.tolist(), top_ids.tolist()
        for i, row in enumerate(rows):
            req = row.request
            tokens, accepted = emitted[i]
            base = len(req.tokens) - len(tokens)           # position of the first emitted token
            first_index = base - len(req.prompt)
            tokens = tokens[: max(0, req.max_tokens - first_index)]
            query_index = starts[i] if not row.is_prefill else starts[i + 1] - 1
            for j, tok in enumerate(tokens):
                records.tokens.append({
                    "req_id": req.req_id, "step": step, "output_index": first_index + j,
                    "position": base + j, "token": tok,
                    "logprob": float(logprobs[query_index + j, tok]),
                })
            if not row.is_prefill and k > 0:
                draft_tokens, draft_logprobs = verified[i]
                for j in range(k):
                    q = starts[i] + j
                    records.drafts.append({
                        "step": step, "req_id": req.req_id, "draft_index": j, "position": base + j,
                        "draft_token": draft_tokens[j], "draft_logprob": draft_logprobs[j],
                        "target_token": top_ids[q][0], "target_logprob": top_lp[q][0],
                        "top5_tokens": top_ids[q], "top5_logprobs": top_lp[q],
                        "accepted": j < accepted, "num_accepted": accepted,
                    })
            if req.num_output >= req.max_tokens or len(req.tokens) + k + 1 > cfg.max_model_len:
                del req.tokens[len(req.prompt) + req.max_tokens:]
                req.finished = True

    def _log(self, records: Records, step: int, d: Dispatch, draft_step: int | None) -> None:
        records.forwards.append({
            "step": step, "phase": d.phase, "draft_step": draft_step, "runtime_mode": d.runtime_mode,
            "num_tokens": d.num_tokens, "num_reqs": d.num_reqs,
            "num_tokens_padded": d.num_tokens_padded, "num_reqs_padded": d.num_reqs_padded,
        })
