"""Turn one verify forward's logits into the tokens each row emits.

Decoding rows go through the rejection sampler (their K drafts against the
target's K+1 distributions); rows that complete a prefill (and every row
without drafts) sample one token from their last position; a prefill chunk
short of its prompt's end emits nothing. Eager, on the verify output.
"""

from __future__ import annotations

import torch

from parity.engine import rejection
from parity.engine.config import EngineConfig


def emit(rows, plans, starts: list[int], logits: torch.Tensor, config: EngineConfig,
         k: int) -> list[tuple[list[int], int]]:
    """Per row: (emitted tokens, number of accepted drafts)."""
    out: list = [None] * len(rows)
    decode = [i for i, r in enumerate(rows) if not r.is_prefill and k > 0]
    plain = [i for i, r in enumerate(rows) if i not in decode and not r.partial]
    for i, row in enumerate(rows):
        if row.partial:
            out[i] = ([], 0)          # a prefill chunk short of the prompt's end samples nothing
    dev = logits.device
    if decode:
        idx = torch.tensor([starts[i] + j for i in decode for j in range(k + 1)], device=dev)
        target_logits = logits[idx].view(len(decode), k + 1, -1)
        drafts = torch.tensor([rows[i].request.drafts for i in decode], device=dev)
        probs = torch.stack([rows[i].request.draft_probs for i in decode]) if config.temperature > 0 else None
        req_ids = torch.tensor([plans[i].req_id for i in decode], device=dev)
        first = torch.tensor([len(rows[i].request.tokens) for i in decode], device=dev)
        tokens, accepted = rejection.rejection_sample(
            drafts, probs, target_logits, temperature=config.temperature, seed=config.seed,
            req_ids=req_ids, first_positions=first)
        tokens, accepted = tokens.tolist(), accepted.tolist()
        for n, i in enumerate(decode):
            out[i] = (tokens[n][: accepted[n] + 1], accepted[n])
    if plain:
        idx = torch.tensor([starts[i + 1] - 1 for i in plain], device=dev)
        req_ids = torch.tensor([plans[i].req_id for i in plain], device=dev)
        positions = torch.tensor([plans[i].seq_len for i in plain], device=dev)
        tokens = rejection.sample_target(logits[idx], temperature=config.temperature, seed=config.seed,
                                         req_ids=req_ids, positions=positions).tolist()
        for n, i in enumerate(plain):
            out[i] = ([tokens[n]], 0)
    return out
