"""Engine configuration: frozen, validated once, never written back into.

`EngineSettings` is the one home of what a scenario sets of the engine: each
setting's name, default and rule. A scenario (`harness/scenario.py`) is built
on it, so a scenario file's keys, their defaults and their checks are these;
`EngineConfig` adds what only the caller decides (`spec_decode`) and the
figures derived from the settings.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from parity.errors import ParityInputError

MAX_K = 32
MAX_TOPK = 8
MAX_TREE_SLOTS = 63     # a tree node's visible nodes are one int64 of bits
MAX_SEED = (1 << 63) - 1     # seeds are folded into int64 arithmetic (engine/rng.py)


class SettingError(ParityInputError):
    """One engine setting breaks its rule; `key` names the setting (a scenario file points at its line)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class EngineSettings:
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
    # Tree drafts (docs/tree.md): `topk` candidates per draft step, K steps, `num_draft_tokens`
    # nodes kept (0: K, the chain). topk 1 is the chain, whatever else is set.
    topk: int = 1
    num_draft_tokens: int = 0

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if not _integer(k) or not 1 <= k <= MAX_K:
            raise SettingError("num_speculative_tokens",
                               f"num_speculative_tokens (K) must be an integer in 1..{MAX_K}, got {k!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len"):
            value = getattr(self, name)
            if not _integer(value) or value < 1:
                raise SettingError(name, f"{name} must be a positive integer, got {value!r}")
        if not _integer(self.seed) or not 0 <= self.seed <= MAX_SEED:
            raise SettingError("seed", f"seed must be an integer in 0..2**63-1, got {self.seed!r}")
        if self.sliding_window < 0:
            raise SettingError("sliding_window", f"sliding_window must be >= 0, got {self.sliding_window}")
        if not self.temperature >= 0:        # also refuses NaN
            raise SettingError("temperature", f"temperature must be >= 0, got {self.temperature}")
        if self.max_model_len < k + 3:
            raise SettingError("max_model_len", f"max_model_len {self.max_model_len} is too small for K={k}")
        _check_tree(k, self.topk, self.num_draft_tokens)
        if self.tree and self.sliding_window:
            raise SettingError("topk", "tree drafts (topk > 1) do not run with a sliding window")
        width = self.tree_width
        if self.max_num_batched_tokens < self.max_num_seqs * (1 + width):
            raise SettingError("max_num_batched_tokens",
                               f"max_num_batched_tokens {self.max_num_batched_tokens} cannot hold "
                               f"{self.max_num_seqs} decoding requests of 1+{width} tokens")

    @property
    def tree(self) -> bool:
        """Tree drafts (topk > 1): the verify forward reads a tree mask."""
        return self.topk > 1

    @property
    def draft_reach(self) -> int:
        """How far past a request's last token one engine step writes KV: K for the chain; for a tree,
        its nodes in the verify or the drafter's frontiers, whichever reaches further."""
        if not self.tree:
            return self.num_speculative_tokens
        return max(self.num_draft_tokens, (self.num_speculative_tokens - 1) * self.topk)

    @property
    def tree_width(self) -> int:
        """Draft tokens verified per request: the kept tree nodes, or K for the chain."""
        return self.num_draft_tokens if self.tree else self.num_speculative_tokens

    def settings(self) -> dict:
        """Just the engine settings (of a scenario too), by name."""
        return {f.name: getattr(self, f.name) for f in fields(EngineSettings)}


@dataclass(frozen=True)
class EngineConfig(EngineSettings):
    spec_decode: bool = True

    @classmethod
    def of(cls, settings: EngineSettings, spec_decode: bool = True) -> EngineConfig:
        """The config of `settings` (a scenario's, say) with `spec_decode`."""
        return cls(**settings.settings(), spec_decode=spec_decode)

    @property
    def blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)

    @property
    def num_blocks(self) -> int:
        # NOTE: enough blocks that no request is ever preempted: the harness
        # compares schedules, and preemption would make them mode-dependent.
        return self.max_num_seqs * self.blocks_per_seq


def max_tree_nodes(steps: int, topk: int) -> int:
    """Candidates a tree of `steps` steps expands: topk at the first step, topk * topk at each later one."""
    return topk + (steps - 1) * topk * topk


def candidate_columns(steps: int, topk: int) -> int:
    """Columns of the drafter's candidate buffers: a tree's candidates, and with K=1 the columns of step 1,
    which a capture of the (never replayed) draft step writes."""
    return max_tree_nodes(max(steps, 2), topk)


def _check_tree(steps: int, topk: int, nodes: int) -> None:
    if not _integer(topk) or not 1 <= topk <= MAX_TOPK:
        raise SettingError("topk", f"topk must be an integer in 1..{MAX_TOPK}, got {topk!r}")
    if not _integer(nodes) or nodes < 0:
        raise SettingError("num_draft_tokens", f"num_draft_tokens must be a non-negative integer, got {nodes!r}")
    if topk == 1:
        if nodes not in (0, steps):
            raise SettingError("num_draft_tokens", f"num_draft_tokens must be K={steps} (the chain) when "
                                                   f"topk is 1, got {nodes}")
        return
    if steps * topk > MAX_TREE_SLOTS:
        raise SettingError("topk", f"K={steps} steps of topk={topk} draft {steps * topk} nodes a step's "
                                   f"attention tells apart, more than {MAX_TREE_SLOTS}")
    most = min(MAX_K, max_tree_nodes(steps, topk))
    if nodes == 0:
        raise SettingError("topk", f"topk={topk} needs num_draft_tokens (1..{most}): the nodes a tree keeps")
    if not 1 <= nodes <= most:
        raise SettingError("num_draft_tokens", f"num_draft_tokens must be in 1..{most} for K={steps} steps "
                                               f"of topk={topk}, got {nodes}")


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
