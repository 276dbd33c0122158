"""The EAGLE proposer: the drafter's own buffers, metadata, inputs, forwards and drafts.

Per engine step: one draft prefill over the verified tokens (the same layout as
the target batch; 1+K tokens per decoding request), then K-1 draft decode
steps of one token per request. Each forward ends with the input update for
the next one (draft token into input_ids, draft hidden into hidden_states,
token/logprob/probs into the output columns picked by the `draft_step` tensor),
so one captured step can be replayed K-1 times. Between replays the metadata is
advanced eagerly by `MetadataBuilder.advance_draft_step`.
"""

from __future__ import annotations

import torch

from parity.engine import rejection, tree_drafter
from parity.engine.buffers import FREE, ROW, TOKEN, InputBuffers, register_attention_buffers
from parity.engine.config import EngineConfig
from parity.engine.kv_cache import PagedKVCache
from parity.engine.metadata import MetadataBuilder, RowPlan
from parity.engine.owner import Forward, Owner
from parity.engine.tree import DraftTree, select_tree
from parity.engine.tree_metadata import RowTree, register_tree_buffers
from parity.models.greedy_draft import greedy_draft, top_gap


# What every draft forward writes per row, besides the next step's inputs; sampled drafting also its distribution
# (`draft_probs`, which rejection sampling reads; greedy acceptance compares tokens only).
DRAFT_OUTPUTS = ("draft_tokens", "draft_logprobs", "draft_gaps")
SAMPLED_OUTPUTS = DRAFT_OUTPUTS + ("draft_probs",)


class EagleProposer(Owner):
    name = "drafter"

    def __init__(self, head, config: EngineConfig, device: torch.device,
                 builder_class: type[MetadataBuilder] = MetadataBuilder):
        super().__init__()
        self.head = head
        # EAGLE-3's map from its draft vocabulary to the target's (None: the head drafts over the target's)
        self.vocab = getattr(head, "vocab", None)
        self.config = config
        hc = head.config
        k = config.num_speculative_tokens
        self.buffers = InputBuffers(self.name, device)
        b = self.buffers
        # A tree's draft step forwards topk nodes per request.
        tokens = max(config.max_num_batched_tokens, config.max_num_seqs * config.topk)
        register_attention_buffers(b, tokens, config.max_num_seqs, config.blocks_per_seq)
        dtype = head.fc.weight.dtype
        vocab = head.lm_head.weight.shape[0]
        b.register("hidden_states", (tokens, hc.hidden_size), dtype, TOKEN, None, FREE)
        b.register("sample_indices", (config.max_num_seqs,), torch.int64, ROW, 0, FREE)
        b.register("draft_step", (1,), torch.int64)
        b.register("draft_tokens", (config.max_num_seqs, k), torch.int64, ROW)
        b.register("draft_logprobs", (config.max_num_seqs, k), torch.float32, ROW)
        if not rejection.is_greedy(config.temperature):
            b.register("draft_probs", (config.max_num_seqs, k, vocab), torch.float32, ROW)
        # top-1 minus top-2 draft logprob: how close a draft was to a tie (numerics reports read it)
        b.register("draft_gaps", (config.max_num_seqs, k), torch.float32, ROW)
        if config.tree:
            register_tree_buffers(b, tokens, config.max_model_len)
            tree_drafter.register_drafter_buffers(b, config, hc.hidden_size, dtype)
        head_dim = getattr(hc, "head_dim", None) or hc.hidden_size // hc.num_attention_heads
        self.kv_cache = PagedKVCache(hc.num_hidden_layers, config.num_blocks, config.block_size,
                                     hc.num_key_value_heads, head_dim, dtype, device)
        # NOTE: the sliding window is a property of the attention metadata
        # builder here (layer 0 of the drafter when any target layer has one),
        # so the drafter's position-dependent state must be rebuilt per step too.
        window_layers = (0,) if config.sliding_window and config.sliding_window_layers else ()
        self.builder = builder_class(b, self.kv_cache, config.block_size, config.max_model_len,
                                     config.sliding_window, window_layers)
        if hasattr(head, "with_step_index"):     # an MTP head: the draft step index selects its layer
            self.head = head.with_step_index(self.step_index)

    def forwards(self) -> tuple[Forward, ...]:
        q = self.config.num_speculative_tokens + 1
        if self.config.tree:
            return self.tree_forwards()
        drafts = DRAFT_OUTPUTS if rejection.is_greedy(self.config.temperature) else SAMPLED_OUTPUTS
        writes = tuple((name, ROW) for name in ("input_ids", "hidden_states") + drafts)
        return (Forward("draft_prefill", self.prefill_forward, self.config.max_num_batched_tokens, q, (), writes,
                        drafts),
                Forward("draft_step", self.step_forward, self.config.max_num_seqs, 1, (), writes, drafts))

    def tree_forwards(self) -> tuple[Forward, ...]:
        """A tree's: the draft prefill writes the first frontier, a draft step the next (`tree_drafter`)."""
        cfg = self.config
        rows = tuple((name, ROW) for name in tree_drafter.TREE_OUTPUTS + tree_drafter.FRONTIER)
        steps = (("input_ids", TOKEN), ("hidden_states", TOKEN)) + rows
        return (Forward("draft_prefill", self.prefill_forward, cfg.max_num_batched_tokens, cfg.tree_width + 1, (),
                        rows + tuple((name, ROW) for name in tree_drafter.ROOT)),
                Forward("draft_step", self.step_forward, cfg.max_num_seqs * cfg.topk, cfg.topk, (), steps))

    def decoder_layers(self) -> list[torch.nn.Module]:
        return list(self.head.decoder_layers())

    def capture_metadata(self, num_tokens_padded: int, num_reqs_padded: int):
        meta = self.builder.build_dummy(num_tokens_padded, num_reqs_padded)
        self.buffers["sample_indices"].zero_()
        self.buffers["draft_step"].zero_()
        return meta

    # --- eager: inputs before the forwards, drafts after them ----------------------------------

    def prepare_prefill(self, rows, plans: list[RowPlan], starts: list[int], emitted, features):
        """Inputs of the draft prefill over the verified tokens; returns (dispatch, metadata).

        EAGLE reads (token at position p+1, target hidden at p): each row's query
        shifted left by one. A decoding row's entry `accepted` holds the newly
        sampled token; later entries (rejected drafts, then a pad) are overwritten
        next step. A prefill row drafts from its last position.
        """
        k, b = self.config.tree_width, self.buffers
        shifted, sample_rows = [], []
        for i, row in enumerate(rows):
            tokens, accepted = emitted[i]
            if row.is_prefill:
                prompt = row.request.prompt
                # The token after the chunk: the next prompt token, or the one just sampled.
                after = prompt[row.chunk_end] if row.partial else tokens[0]
                shifted += prompt[row.chunk_start + 1:row.chunk_end] + [after]
                sample_rows.append(starts[i + 1] - 1)
            else:
                drafts = row.request.drafts
                shifted += (tokens + drafts[accepted + 1:] + [0])[: k + 1]
                sample_rows.append(starts[i] + accepted)
        num_tokens, n = starts[-1], len(rows)
        assert len(shifted) == num_tokens, "draft inputs must line up with the verified tokens"
        d = self.executor.dispatch("draft_prefill", num_tokens, n, all(not r.is_prefill for r in rows))
        # NOTE: EAGLE-3's fusion of the target's auxiliary hidden states runs here,
        # eagerly, outside the drafter's graphs (they start from the fused features).
        b["hidden_states"][:num_tokens].copy_(self.head.fuse_target_hidden(features[:num_tokens]))
        meta = self.builder.build(plans, d.num_tokens_padded, d.num_reqs_padded, input_ids=shifted)
        b["sample_indices"][: d.num_reqs_padded].copy_(torch.tensor(sample_rows + [0] * (d.num_reqs_padded - n)))
        b["draft_step"].fill_(0)
        meta.draft_step = 0
        return d, meta

    def prepare_steps(self, rows):
        """Metadata of the draft decode steps (one token per row, after the emitted tokens)."""
        if self.config.tree:
            return self.prepare_tree_steps(rows)
        n = len(rows)
        plans = [RowPlan(r.request.req_id, [0], len(r.request.tokens) - 1, r.request.blocks) for r in rows]
        d = self.executor.dispatch("draft_step", n, n, True)
        meta = self.builder.build(plans, d.num_tokens_padded, d.num_reqs_padded, write_input_ids=False)
        self.buffers["draft_step"].fill_(1)
        meta.draft_step = 1
        return d, meta

    def prepare_tree_steps(self, rows):
        """Metadata of the first tree draft step: the root's topk children, after the emitted tokens."""
        n, k = len(rows), self.config.topk
        plans = []
        for r in rows:
            base = len(r.request.tokens) - 1
            tree = RowTree((base,) * k, base, tuple(1 << c for c in range(k)))
            plans.append(RowPlan(r.request.req_id, [0] * k, base, r.request.blocks, tree))
        d = self.executor.dispatch("draft_step", n * k, n, True)
        meta = self.builder.build(plans, d.num_tokens_padded, d.num_reqs_padded, write_input_ids=False)
        tree_drafter.first_inputs(self.buffers, k, n)
        self.buffers["draft_step"].fill_(1)
        meta.draft_step = 1
        return d, meta

    def advance(self, meta, dispatch) -> None:
        """Between draft decode steps: advance the metadata, move the step index on."""
        self.builder.advance_draft_step(meta, dispatch.num_reqs_padded)
        self.buffers["draft_step"].add_(1)
        meta.draft_step += 1

    def read_drafts(self, n: int) -> list[tuple]:
        """Per row: the K draft tokens, their logprobs, top-2 gaps and (when sampling) distributions."""
        b = self.buffers
        tokens = b["draft_tokens"][:n].tolist()
        logprobs = b["draft_logprobs"][:n].tolist()
        gaps = b["draft_gaps"][:n].tolist()
        probs = b["draft_probs"][:n].clone() if self.config.temperature > 0 else None
        return [(tokens[i], logprobs[i], gaps[i], probs[i] if probs is not None else None) for i in range(n)]

    def read_trees(self, n: int) -> list[DraftTree]:
        """Per row: the tree kept of this engine step's candidates."""
        cfg = self.config
        return [select_tree(*row, cfg.num_draft_tokens)
                for row in tree_drafter.read_candidates(self.buffers, n, cfg.num_speculative_tokens, cfg.topk)]

    # --- captured bodies -------------------------------------------------------------

    def prefill_forward(self, num_tokens_padded: int, num_reqs_padded: int, meta) -> tuple:
        """Draft prefill over the verified tokens; samples draft token 0 at `sample_indices`."""
        b = self.buffers
        t = num_tokens_padded
        positions = b["positions"][:t]
        hidden = self.head(b["input_ids"][:t], positions, b["hidden_states"][:t], meta)
        rows = b["sample_indices"][:num_reqs_padded]
        row_hidden = hidden[rows]
        self._emit(num_reqs_padded, row_hidden, lambda: positions[rows] + 2)
        return ()

    def step_forward(self, num_tokens_padded: int, num_reqs_padded: int, meta) -> tuple:
        """One draft decode step: one token per row, forward + logits + sample + input update.

        A token-keyed graph may pad tokens beyond the rows; those are inert padding.
        """
        b = self.buffers
        t, n = num_tokens_padded, num_reqs_padded
        positions = b["positions"][:t]
        hidden = self.head(b["input_ids"][:t], positions, b["hidden_states"][:t], meta)
        if self.config.tree:
            k = self.config.topk
            rows = tree_drafter.frontier_rows(t, n, k)
            nodes = hidden[: rows * k]
            tree_drafter.expand(b, k, rows, self.draft_logits(nodes), nodes)
            return ()
        self._emit(n, hidden[:n], lambda: positions[:n] + 2)
        return ()

    def _emit(self, n: int, row_hidden: torch.Tensor, drafted_positions) -> None:
        """Sample one draft token per row and write the inputs of the next draft step (`drafted_positions()`: the
        drafted tokens' positions [n], computed only where a sampler keys its random numbers on them)."""
        b = self.buffers
        cfg = self.config
        if cfg.tree:
            tree_drafter.emit_root(b, cfg.topk, n, self.draft_logits(row_hidden), row_hidden)
            return
        # NOTE: drafting reduces over the drafter's own vocabulary (EAGLE-3's 32k of Llama 3's 128k ids: every
        # single-row reduction a quarter as long); only the drawn token and draft_probs are in the target's.
        logits = self.own_logits(row_hidden)
        if rejection.is_greedy(cfg.temperature):
            # One op stores the token, its log-probability and top-2 gap at the step's column (one kernel on CUDA).
            tokens = greedy_draft(logits, None if self.vocab is None else self.vocab.d2t, self.draft_column(n),
                                  *(b[name][:n] for name in DRAFT_OUTPUTS))
        else:
            tokens = self._draw(logits, n, self.sampling_positions(drafted_positions()))
        b["input_ids"][:n].copy_(tokens)
        self.store_hidden(row_hidden, n)

    def sampling_positions(self, drafted_positions: torch.Tensor) -> torch.Tensor:
        """What keys the draft sampler's random numbers with the request: the drafted positions."""
        return drafted_positions

    def _draw(self, logits: torch.Tensor, n: int, positions: torch.Tensor) -> torch.Tensor:
        """Sampled drafting: each row's token drawn from its `logits` over the drafter's vocabulary, stored with its
        log-probability, top-2 gap and the drafted distribution at the step's column; returns the target tokens
        [n]."""
        cfg, b = self.config, self.buffers
        drawn = rejection.sample_draft(logits, temperature=cfg.temperature, seed=cfg.seed, req_ids=b["req_ids"][:n],
                                       positions=positions)
        all_logprobs = torch.log_softmax(logits, dim=-1)
        tokens = drawn if self.vocab is None else self.vocab.to_target(drawn)
        logprobs, gaps = all_logprobs.gather(1, drawn.unsqueeze(1)), top_gap(all_logprobs)
        column = self.draft_column(n)                                      # [n, 1]
        b["draft_tokens"][:n].scatter_(1, column, tokens.unsqueeze(1))
        b["draft_logprobs"][:n].scatter_(1, column, logprobs)
        b["draft_gaps"][:n].scatter_(1, column, gaps)
        probs = self._draft_distribution(logits)
        vocab = probs.shape[-1]
        b["draft_probs"][:n].scatter_(1, column.unsqueeze(2).expand(n, 1, vocab), probs.unsqueeze(1))
        return tokens

    def own_logits(self, row_hidden: torch.Tensor) -> torch.Tensor:
        """The draft distribution's logits for the drafted rows over the drafter's own vocabulary: [n, V_draft]
        fp32 (EAGLE-3's draft vocabulary; every other head's is the target's)."""
        own = getattr(self.head, "own_logits", None)
        return self.head.logits(row_hidden) if own is None else own(row_hidden)

    def draft_logits(self, row_hidden: torch.Tensor) -> torch.Tensor:
        """The same over the target vocabulary: [n, vocab] fp32 (ids outside a draft vocabulary -inf)."""
        logits = self.own_logits(row_hidden)
        return logits if self.vocab is None else self.vocab.logits_to_target(logits)

    def _draft_distribution(self, logits: torch.Tensor) -> torch.Tensor:
        """What draft_probs holds when sampling: the drafted distribution over the target vocabulary, [n, vocab]
        fp32."""
        probs = rejection.draft_distribution(logits, self.config.temperature)
        return probs if self.vocab is None else self.vocab.distribution_to_target(probs)

    def draft_column(self, n: int) -> torch.Tensor:
        """The output column of this draft step, from the `draft_step` buffer: [n, 1]."""
        return self.buffers["draft_step"].expand(n).unsqueeze(1)

    def store_hidden(self, row_hidden: torch.Tensor, n: int) -> None:
        """The draft hidden states become the next step's hidden input."""
        self.buffers["hidden_states"][:n].copy_(row_hidden)

    def step_index(self) -> torch.Tensor:
        """The draft step index an MTP head selects its layer by: the `draft_step` buffer, [1] int64."""
        return self.buffers["draft_step"]

