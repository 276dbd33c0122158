"""Where a forward's tokens sit in the attention tiles on CUDA: one Triton kernel against the torch path.

`attention_tiles.tile_layout` against its torch implementation on good
batches and on the broken metadata a fault hands in, bit for bit and dtype
for dtype: where each slot's token sits, its output row, each tile's row and
KV blocks, and each slot's causal bound.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.models import attention_tiles
from parity.models.attention_tiles import plan_tiles

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@st.composite
def batches(draw):
    num_tokens, num_rows = draw(st.integers(1, 300)), draw(st.integers(1, 70))
    if draw(st.booleans()):         # good metadata: 0 = qsl[0] <= ... <= T
        cuts = sorted(draw(st.lists(st.integers(0, num_tokens), min_size=num_rows, max_size=num_rows)))
        qsl = [0] + cuts
    else:                           # stale or broken: anything near the batch's range
        qsl = draw(st.lists(st.integers(-2, 3 * num_tokens), min_size=num_rows + 1, max_size=num_rows + 1))
    dtypes = st.sampled_from([torch.int32, torch.int64])
    return num_tokens, qsl, draw(dtypes), draw(dtypes), draw(st.integers(1, 80))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(batches())
def test_the_tile_layout_kernel_is_the_torch_layout_bit_for_bit(batch):
    # seq_lens in query_start_loc's dtype, positions int64, as engines hold them (each new dtype is a compile)
    num_tokens, qsl, qsl_dtype, table_dtype, table_width = batch
    check_layout(num_tokens, qsl, qsl_dtype, table_dtype, table_width, qsl_dtype, torch.int64)


@pytest.mark.parametrize("lens_dtype,positions_dtype", [(torch.int32, torch.int32), (torch.int64, torch.int32)])
def test_the_causal_bound_takes_the_dtype_torch_promotes_to(lens_dtype, positions_dtype):
    check_layout(37, [0, 4, 4, 20, 37], torch.int32, torch.int32, 8, lens_dtype, positions_dtype)


def check_layout(num_tokens, qsl, qsl_dtype, table_dtype, table_width, lens_dtype, positions_dtype):
    rows = len(qsl) - 1
    plan = plan_tiles(num_tokens, rows, 32, 8, 128, 2, 16, 16 * table_width, table_width)
    q = torch.tensor(qsl, dtype=qsl_dtype, device="cuda")
    table = torch.randint(0, 10_000, (rows, table_width), dtype=table_dtype, device="cuda")
    # Padded rows' zero lengths and positions past a row's context included: the bound is the smaller of the two.
    seq_lens = torch.randint(0, 300, (rows,), dtype=lens_dtype, device="cuda")
    positions = torch.randint(0, 300, (num_tokens + 3,), dtype=positions_dtype, device="cuda")
    args = (seq_lens, positions, num_tokens, plan.tile_len, plan.num_tiles, plan.num_blocks)
    torch_path = attention_tiles._torch_tile_layout(q, table, *args)
    kernel = attention_tiles.tile_layout(q, table, *args)       # the op's CUDA implementation: the kernel
    assert len(kernel) == len(torch_path) == 5
    for name, want, got in zip(("slot tokens", "target", "tile rows", "blocks", "bounds"), torch_path, kernel):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got, want), (name, qsl, plan.tile_len)

