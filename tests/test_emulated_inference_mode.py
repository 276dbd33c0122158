"""parity.audit.emulated under torch.inference_mode, op by op, and its weak_ref_tensors' memory lifetime.

Under inference mode composite ops (`.to(dtype)`, `.contiguous()`, `reshape`
of a non-contiguous tensor) reach the recorder undecomposed with aliasing
schemas although they compute fresh memory: replay must recompute them, not
keep their capture-time values. The same bodies run on CUDA (marked gpu), so
the emulated semantics are held against the real ones.
"""

from __future__ import annotations

import pytest
import torch

from parity.audit import emulated

GRAD_MODES = [torch.no_grad, torch.inference_mode]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
OPS = {
    "to_dtype": lambda x: x.to(torch.float64).sum(-1).float(),
    "float": lambda x: (x.to(torch.float16).float() * 2),
    "contiguous": lambda x: x.t().contiguous() + 1,
    "reshape_copy": lambda x: x.t().reshape(-1) * 3,
    "flatten_view": lambda x: x.flatten() - 1,
    "type_as": lambda x: x.type_as(torch.zeros(1, dtype=torch.float64, device=x.device)) / 7,
}


def graphs_for(device: str):
    return torch.cuda if device == "cuda" else emulated


def _capture(api, fn, static, pool=None):
    graph = api.CUDAGraph()
    if api is torch.cuda:          # warm up on a side stream, as torch.cuda graphs need
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn(static)
        torch.cuda.current_stream().wait_stream(stream)
    with api.graph(graph, pool=pool):
        out = fn(static)
    return graph, out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grad_mode", GRAD_MODES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("op", sorted(OPS))
def test_replay_recomputes_every_op_from_the_live_input(op, grad_mode, device):
    fn, api = OPS[op], graphs_for(device)
    with grad_mode():
        # NOTE: the CPU generator: a CUDA capture another test aborted on purpose (tests/test_capture_checks.py)
        # leaves this process's CUDA generator unusable outside a capture.
        static = torch.randn(4, 3, generator=torch.Generator().manual_seed(99)).to(device)
        graph, out = _capture(api, fn, static)
        for seed in range(3):
            static.copy_(torch.randn(4, 3, generator=torch.Generator().manual_seed(seed)).to(device))
            graph.replay()
            api.synchronize()
            assert torch.equal(out, fn(static)), f"{op}: replay kept capture-time values"


@pytest.mark.parametrize("grad_mode", GRAD_MODES, ids=lambda m: m.__name__)
def test_a_weakly_referenced_output_keeps_its_pool_block_while_its_owner_holds_it(grad_mode):
    """vLLM's intermediate piece: its output goes on to the next piece while the wrapper keeps only a weak ref."""
    with grad_mode():
        pool, static = emulated.graph_pool_handle(), torch.randn(256)
        _, held = _capture(emulated, lambda x: x * 2, static, pool)
        weak = emulated.weak_ref_tensors(held)
        _, other = _capture(emulated, lambda x: x + 5, static, pool)
        assert other.data_ptr() != weak.data_ptr()            # still owned: not handed out again
        expected = weak.clone()
        assert torch.equal(weak, held) and torch.equal(weak, expected)
        del held, other                                          # the owners let go: the blocks return
        _, reused = _capture(emulated, lambda x: x - 5, static, pool)
        assert reused.data_ptr() == weak.data_ptr()           # as the CUDA caching allocator would


def test_an_output_turned_weak_inside_the_capture_block_returns_at_once():
    """vLLM's last piece and FULL graphs: `output = weak_ref_tensors(output)` inside the block."""
    pool, static = emulated.graph_pool_handle(), torch.randn(256)
    graph = emulated.CUDAGraph()
    with emulated.graph(graph, pool=pool):
        out = emulated.weak_ref_tensors(static * 2)
    _, reused = _capture(emulated, lambda x: x + 1, static, pool)
    assert reused.data_ptr() == out.data_ptr()
