"""The target side: its persistent buffers, metadata builder and verify forward."""

from __future__ import annotations

import torch

from parity.engine.buffers import InputBuffers, register_attention_buffers
from parity.engine.config import EngineConfig
from parity.engine.kv_cache import PagedKVCache
from parity.engine.metadata import MetadataBuilder
from parity.engine import state_slots
from parity.engine.owner import Forward, Owner
from parity.engine.tree_metadata import register_tree_buffers


class TargetRunner(Owner):
    name = "target"

    def __init__(self, model, config: EngineConfig, device: torch.device,
                 builder_class: type[MetadataBuilder] = MetadataBuilder):
        super().__init__()
        self.model = model
        self.config = config
        mc = model.config
        self.buffers = InputBuffers(self.name, device)
        register_attention_buffers(self.buffers, config.max_num_batched_tokens, config.max_num_seqs,
                                   config.blocks_per_seq)
        if config.tree and config.spec_decode:
            register_tree_buffers(self.buffers, config.max_num_batched_tokens, config.max_model_len)
        head_dim = getattr(mc, "head_dim", None) or mc.hidden_size // mc.num_attention_heads
        self.kv_cache = PagedKVCache(mc.num_hidden_layers, config.num_blocks, config.block_size,
                                     mc.num_key_value_heads, head_dim, model.lm_head.weight.dtype, device)
        builder_class = state_slots.builder_class(model, builder_class)
        self.builder = builder_class(self.buffers, self.kv_cache, config.block_size, config.max_model_len,
                                     config.sliding_window, config.sliding_window_layers)
        # A hybrid target's recurrent state (None for attention only): `state_slots`.
        self.state_slots = state_slots.attach(self, config, device)

    def forwards(self) -> tuple[Forward, ...]:
        return (Forward("verify", self.verify, self.config.max_num_batched_tokens,
                        self.config.tree_width + 1, ("logits", "features")),)

    def state_tensors(self) -> list[torch.Tensor]:
        return super().state_tensors() + (self.state_slots.tensors() if self.state_slots else [])

    def settle(self, rows, plans, emitted) -> None:
        """After sampling: commit the recurrent state each row kept (hybrid targets; nothing otherwise)."""
        if self.state_slots is not None:
            self.state_slots.settle(rows, plans, emitted)

    def decoder_layers(self) -> list[torch.nn.Module]:
        return list(self.model.decoder_layers())

    def verify(self, num_tokens_padded: int, num_reqs_padded: int, meta) -> tuple[torch.Tensor, torch.Tensor]:
        """Verify / prefill forward over the buffers: (logits [T, V] fp32, drafter features [T, *])."""
        b = self.buffers
        t = num_tokens_padded
        hidden, aux = self.model(b["input_ids"][:t], b["positions"][:t], meta)
        return self.logits(hidden), (aux if aux is not None else hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's logits for every token of the batch: [T, vocab] fp32."""
        return self.model.logits(hidden)
