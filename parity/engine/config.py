"""Engine configuration: frozen, validated once, never written back into."""

from __future__ import annotations

from dataclasses import dataclass

from parity.errors import ParityInputError

MAX_K = 32


@dataclass(frozen=True)
class EngineConfig:
    num_speculative_tokens: int = 3          # K
    max_num_seqs: int = 4
    max_num_batched_tokens: int = 256
    block_size: int = 16
    max_model_len: int = 256
    temperature: float = 0.0
    seed: int = 0
    # A sliding window (tokens) on these layers: its start is position-dependent
    # metadata that must be rebuilt every draft step (seed 001). 0 = off.
    sliding_window: int = 0
    sliding_window_layers: tuple[int, ...] = ()
    spec_decode: bool = True

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise ParityInputError(f"num_speculative_tokens (K) must be an integer in 1..{MAX_K}, got {k!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ParityInputError(f"{name} must be a positive integer, got {value!r}")
        if self.sliding_window < 0:
            raise ParityInputError(f"sliding_window must be >= 0, got {self.sliding_window}")
        if self.temperature < 0:
            raise ParityInputError(f"temperature must be >= 0, got {self.temperature}")
        if self.max_model_len < self.num_speculative_tokens + 3:
            raise ParityInputError(f"max_model_len {self.max_model_len} is too small for K={k}")
        if self.max_num_batched_tokens < self.max_num_seqs * (1 + k):
            raise ParityInputError(
                f"max_num_batched_tokens {self.max_num_batched_tokens} cannot hold "
                f"{self.max_num_seqs} decoding requests of 1+K={1 + k} tokens")

    @property
    def blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)

    @property
    def num_blocks(self) -> int:
        # NOTE: enough blocks that no request is ever preempted: the harness
        # compares schedules, and preemption would make them mode-dependent.
        return self.max_num_seqs * self.blocks_per_seq
