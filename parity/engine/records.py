"""Per-token records of one run, collected as plain rows and returned as DataFrames."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

DRAFT_COLUMNS = ["step", "req_id", "draft_index", "position", "draft_token", "draft_logprob",
                 "target_token", "target_logprob", "top5_tokens", "top5_logprobs", "accepted",
                 "num_accepted"]
TOKEN_COLUMNS = ["req_id", "step", "output_index", "position", "token", "logprob"]
FORWARD_COLUMNS = ["step", "phase", "draft_step", "runtime_mode", "num_tokens", "num_reqs",
                   "num_tokens_padded", "num_reqs_padded"]


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
