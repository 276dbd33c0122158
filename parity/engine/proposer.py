"""The EAGLE proposer: the drafter's own buffers, metadata, prefill and decode step.

Per engine step: one draft prefill over the verified tokens (the same layout as
the target batch; 1+K tokens per decoding request), then K-1 draft decode
steps of one token per request. Each forward ends with the input update for
the next one (draft token into input_ids, draft hidden into hidden_states,
token/logprob/probs into the output columns picked by the `draft_step` tensor),
so one captured step can be replayed K-1 times. Between replays the metadata is
rebuilt eagerly by `MetadataBuilder.advance_draft_step`.
"""

from __future__ import annotations

import torch

from parity.engine import rejection
from parity.engine.buffers import InputBuffers, register_attention_buffers
from parity.engine.config import EngineConfig
from parity.engine.kv_cache import PagedKVCache
from parity.engine.metadata import MetadataBuilder
from parity.graphs.context import current_metadata


class EagleProposer:
    def __init__(self, head, config: EngineConfig, device: torch.device):
        self.head = head
        self.config = config
        hc = head.config
        k = config.num_speculative_tokens
        self.buffers = InputBuffers("drafter", device)
        b = self.buffers
        register_attention_buffers(b, config.max_num_batched_tokens, config.max_num_seqs, config.blocks_per_seq)
        dtype = head.fc.weight.dtype
        vocab = head.lm_head.weight.shape[0]
        b.register("hidden_states", (config.max_num_batched_tokens, hc.hidden_size), dtype)
        b.register("sample_indices", (config.max_num_seqs,), torch.int64)
        b.register("draft_step", (1,), torch.int64)
        b.register("draft_tokens", (config.max_num_seqs, k), torch.int64)
        b.register("draft_logprobs", (config.max_num_seqs, k), torch.float32)
        b.register("draft_probs", (config.max_num_seqs, k, vocab), torch.float32)
        head_dim = getattr(hc, "head_dim", None) or hc.hidden_size // hc.num_attention_heads
        self.kv_cache = PagedKVCache(hc.num_hidden_layers, config.num_blocks, config.block_size,
                                     hc.num_key_value_heads, head_dim, dtype, device)
        # NOTE: the sliding window is a property of the attention metadata
        # builder here (layer 0 of the drafter when any target layer has one),
        # so the drafter's position-dependent state must be rebuilt per step too.
        window_layers = (0,) if config.sliding_window and config.sliding_window_layers else ()
        self.builder = MetadataBuilder(b, self.kv_cache, config.block_size, config.max_model_len,
                                       config.sliding_window, window_layers, config.faults, drafter=True)
        self.faults = config.faults
        self.last_hidden: torch.Tensor | None = None

    def advance(self, meta, num_reqs_padded: int) -> None:
        """Eager, between draft decode steps: rebuild the metadata, move the step index on."""
        self.builder.advance_draft_step(meta, num_reqs_padded)
        self.buffers["draft_step"].add_(1)
        meta.draft_step += 1

    def after_forward(self, num_rows: int) -> None:
        """Eager work after a drafter forward (nothing, in a correct engine)."""
        if "hidden-states-not-copied" in self.faults:
            # FAULT: the hidden-state update was moved out of the captured step; it
            # copies whatever tensor the step function last produced in Python.
            self.buffers["hidden_states"][:num_rows].copy_(self.last_hidden[:num_rows])

    # --- captured bodies -------------------------------------------------------------

    def prefill_forward(self, num_tokens_padded: int, num_reqs_padded: int) -> tuple:
        """Draft prefill over the verified tokens; samples draft token 0 at `sample_indices`."""
        b = self.buffers
        meta = current_metadata()
        t = num_tokens_padded
        positions = b["positions"][:t]
        hidden = self.head(b["input_ids"][:t], positions, b["hidden_states"][:t], meta)
        rows = b["sample_indices"][:num_reqs_padded]
        row_hidden = hidden[rows]
        self._emit(num_reqs_padded, row_hidden, positions[rows] + 2, meta)
        return ()

    def step_forward(self, num_tokens_padded: int, num_reqs_padded: int) -> tuple:
        """One draft decode step: one token per row, forward + logits + sample + input update.

        A token-keyed graph may pad tokens beyond the rows; those are inert padding.
        """
        b = self.buffers
        t, n = num_tokens_padded, num_reqs_padded
        meta = current_metadata()
        positions = b["positions"][:t]
        hidden = self.head(b["input_ids"][:t], positions, b["hidden_states"][:t], meta)
        self._emit(n, hidden[:n], positions[:n] + 2, meta)
        return ()

    def _emit(self, n: int, row_hidden: torch.Tensor, drafted_positions: torch.Tensor, meta) -> None:
        """Sample one draft token per row and write the inputs of the next draft step."""
        b = self.buffers
        cfg = self.config
        logits = self.head.logits(row_hidden)
        req_ids = b["req_ids"][:n]
        tokens = rejection.sample_draft(logits, temperature=cfg.temperature, seed=cfg.seed,
                                        req_ids=req_ids, positions=drafted_positions)
        probs = rejection.draft_distribution(logits, cfg.temperature)
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens.unsqueeze(1))
        if "frozen-draft-step" in self.faults:
            # FAULT: the step index comes in as a Python int (baked at capture).
            column = torch.full((n, 1), meta.draft_step, dtype=torch.int64, device=tokens.device)
        else:
            column = b["draft_step"].expand(n).unsqueeze(1)               # [n, 1]
        b["draft_tokens"][:n].scatter_(1, column, tokens.unsqueeze(1))
        b["draft_logprobs"][:n].scatter_(1, column, logprobs)
        vocab = probs.shape[-1]
        b["draft_probs"][:n].scatter_(1, column.unsqueeze(2).expand(n, 1, vocab), probs.unsqueeze(1))
        b["input_ids"][:n].copy_(tokens)
        if "hidden-states-not-copied" in self.faults:
            self.last_hidden = row_hidden
        else:
            b["hidden_states"][:n].copy_(row_hidden)
