"""Per-token records of one run, collected as plain rows and returned as DataFrames."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch

DRAFT_COLUMNS = ["step", "req_id", "draft_index", "position", "draft_token", "draft_logprob",
                 "draft_top2_gap", "target_token", "target_logprob", "top5_tokens", "top5_logprobs",
                 "accepted", "num_accepted"]
# top2_gap: top-1 minus top-2 target logprob at the row that emitted the token (a near tie when small)
TOKEN_COLUMNS = ["req_id", "step", "output_index", "position", "token", "logprob", "top2_gap"]
FORWARD_COLUMNS = ["step", "phase", "draft_step", "runtime_mode", "num_tokens", "num_reqs",
                   "num_tokens_padded", "num_reqs_padded"]
TOP_K = 5


@dataclass
class Records:
    drafts: list[dict] = field(default_factory=list)
    tokens: list[dict] = field(default_factory=list)
    forwards: list[dict] = field(default_factory=list)

    def frames(self) -> dict[str, pd.DataFrame]:
        return {
            "drafts": pd.DataFrame(self.drafts, columns=DRAFT_COLUMNS),
            "tokens": pd.DataFrame(self.tokens, columns=TOKEN_COLUMNS),
            "forwards": pd.DataFrame(self.forwards, columns=FORWARD_COLUMNS),
        }

    def log_forward(self, step: int, dispatch, draft_step: int | None) -> None:
        d = dispatch
        self.forwards.append({
            "step": step, "phase": d.phase, "draft_step": draft_step, "runtime_mode": d.runtime_mode,
            "num_tokens": d.num_tokens, "num_reqs": d.num_reqs,
            "num_tokens_padded": d.num_tokens_padded, "num_reqs_padded": d.num_reqs_padded,
        })

    def record_step(self, step: int, rows, starts: list[int], emitted, verified, logits: torch.Tensor,
                    k: int) -> None:
        """The emitted tokens (with the target's logprob) and every verified draft of one step."""
        self.read_logits(self.step_entries(step, rows, starts, emitted, verified, k), logits[: starts[-1]])

    def step_entries(self, step: int, rows, starts: list[int], emitted, verified, k: int) -> "StepEntries":
        """What the host knows of one step now: the records without the target's logprobs, and the logits
        row each one reads them from."""
        entries = StepEntries()
        for i, row in enumerate(rows):
            req = row.request
            tokens, accepted = emitted[i]
            base = len(req.tokens) - len(tokens)           # position of the first emitted token
            first_index = base - len(req.prompt)
            tokens = tokens[: max(0, req.max_tokens - first_index)]
            query_index = starts[i] if not row.is_prefill else starts[i + 1] - 1
            for j, tok in enumerate(tokens):
                entries.tokens.append((query_index + j, {
                    "req_id": req.req_id, "step": step, "output_index": first_index + j,
                    "position": base + j, "token": tok}))
            if row.is_prefill or k == 0:
                continue
            draft_tokens, draft_logprobs, draft_gaps = verified[i]
            for j in range(k):
                entries.drafts.append((starts[i] + j, {
                    "step": step, "req_id": req.req_id, "draft_index": j, "position": base + j,
                    "draft_token": draft_tokens[j], "draft_logprob": draft_logprobs[j],
                    "draft_top2_gap": draft_gaps[j], "accepted": j < accepted, "num_accepted": accepted}))
        return entries

    def read_logits(self, entries: "StepEntries", logits: torch.Tensor) -> None:
        """Complete a step's records from the target's logits of that step ([tokens, vocab]) and keep them."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        top_lp, top_ids = logprobs.topk(TOP_K, dim=-1)
        top_lp, top_ids = top_lp.tolist(), top_ids.tolist()
        for q, record in entries.tokens:
            self.tokens.append({**record, "logprob": float(logprobs[q, record["token"]]),
                                "top2_gap": top_lp[q][0] - top_lp[q][1]})
        for q, record in entries.drafts:
            self.drafts.append({**record, "target_token": top_ids[q][0], "target_logprob": top_lp[q][0],
                                "top5_tokens": top_ids[q], "top5_logprobs": top_lp[q]})


@dataclass
class StepEntries:
    """One step's records before the target's logprobs are read: (logits row, record) pairs."""

    tokens: list[tuple[int, dict]] = field(default_factory=list)
    drafts: list[tuple[int, dict]] = field(default_factory=list)


@dataclass
class RunResult:
    """What one engine run produced: records plus the emitted tokens per request."""

    drafts: pd.DataFrame
    tokens: pd.DataFrame
    forwards: pd.DataFrame
    outputs: dict[int, list[int]]
    num_steps: int
    free_blocks_at_end: int
    total_blocks: int
