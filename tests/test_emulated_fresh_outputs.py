"""An op that writes an argument in place and also returns a fresh tensor, replayed on both graph backends.

A custom op (`mutates_args`) may do both, as the greedy draft op does: the
fresh output lives in the graph's pool next to the temporaries before it (on
the emulated backend, in one arena storage with them), and replay must
refresh it, as a CUDA graph's kernel rewrites it, besides the argument.
"""

from __future__ import annotations

import pytest
import torch

from tests.test_emulation_faithful import BACKENDS, READERS, Owner, eager, graph_capture, make_backend, replay

N = 1024


@torch.library.custom_op("parity_test::store_and_sum", mutates_args=("store",))
def _store_and_sum(x: torch.Tensor, store: torch.Tensor) -> torch.Tensor:
    """Writes x + 1 into `store` and returns a fresh tensor: the shape of a custom op that does both."""
    store.copy_(x + 1)
    return x.sum(0, keepdim=True)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_an_op_that_writes_an_argument_and_returns_a_fresh_tensor_replays_both(backend_name, reader):
    """The op's fresh output lives in the graph's pool next to the temporaries before it (on the emulated
    backend, in one arena storage with them): replay refreshes it, as a CUDA graph's kernel rewrites it."""
    backend = make_backend(backend_name)
    owner = Owner(backend, reader)
    store = torch.zeros(N, device=backend.device)

    def fn(meta):
        x = meta.x if reader == "metadata" else owner.registry["x"]
        fresh = _store_and_sum(torch.tanh(x * 3.0), store)
        return (torch.cat([fresh * 2.0, store]),)

    graph = graph_capture(backend, fn, owner.meta())
    for seed in (4, 5):
        owner.registry["x"].copy_(owner.values(seed))
        meta = owner.meta()
        got = replay(graph, meta)
        assert torch.equal(got, eager(fn, meta)), f"values {seed}"
