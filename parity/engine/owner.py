"""An owner: one side of the engine (target or drafter) with everything its forwards touch.

Graph installation and the diagnosis reach an engine only through its owners:
the persistent buffers, the KV cache, the metadata builder, the forwards (each
with its phase, largest batch and uniform query length) and the executor that
runs them. Nothing outside the engine walks `engine.target.*` chains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from parity.engine.buffers import InputBuffers, poison_padding
from parity.engine.kv_cache import PagedKVCache
from parity.graphs.descriptor import EagerExecutor
from parity.models.decoder_layer import observed_layers


@dataclass(frozen=True)
class Forward:
    """One kind of forward an owner runs: `fn(num_tokens_padded, num_reqs_padded, meta)`."""

    phase: str
    fn: Callable
    max_tokens: int            # the largest batch (in tokens) this phase ever runs
    uniform_query_len: int     # tokens per request when every request has the same query length
    outputs: tuple[str, ...] = ()   # the names of what `fn` returns, in order
    # The buffers `fn` writes its results into, each with how the written entries are indexed (a draft
    # step writes the next step's inputs per row into token-indexed buffers).
    writes: tuple[tuple[str, str], ...] = ()
    # Of those, the buffers ([rows, draft steps, ...]) a draft forward writes one column of: its draft step's
    # (the earlier columns hold this engine step's earlier drafts, the later ones the previous step's).
    step_columns: tuple[str, ...] = ()


class Owner:
    """Base of the target runner and the proposer."""

    name: str
    buffers: InputBuffers
    kv_cache: PagedKVCache

    def __init__(self):
        self.executor = EagerExecutor()
        self._poisoned = 0

    def forwards(self) -> tuple[Forward, ...]:
        raise NotImplementedError

    def forward(self, phase: str) -> Forward:
        return next(f for f in self.forwards() if f.phase == phase)

    def capture_metadata(self, num_tokens_padded: int, num_reqs_padded: int):
        """The inert metadata (and inputs) a graph of this owner is captured with."""
        return self.builder.build_dummy(num_tokens_padded, num_reqs_padded)

    def decoder_layers(self) -> list[torch.nn.Module]:
        raise NotImplementedError

    def layer_outputs(self, run: Callable[[], object]) -> list[tuple]:
        """`run()` (a forward of this owner, eager), and what each decoder layer it ran produced, in order
        (`decoder_layer.observed_layers`)."""
        with observed_layers() as found:
            run()
        return found

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor a forward of this owner may read or write: its buffers and its KV cache."""
        return [t for _, t in self.buffers.items()] + self.kv_cache.tensors()

    def poison_padding(self, dispatch) -> None:
        """Before a padded forward of a reference: padded inputs get values no real output may depend on."""
        poison_padding(self.buffers, dispatch, self._poisoned)
        self._poisoned += 1
