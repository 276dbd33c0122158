"""A vLLM-V1-shaped model runner: persistent input buffers, a metadata builder, graphs keyed by batch descriptor.

    runner = ModelRunner(CUDAGraphMode.PIECEWISE, grad_mode=torch.inference_mode)
    tokens, logits = runner.generate(prompts, max_new)

Prefill runs eagerly; decode batches are padded to a capture size and run in
`mode`: FULL (the whole forward one graph) or PIECEWISE (pieces graphed,
attention eager between them), or NONE (eager at the same padded shape: the
reference). Capture and serving run under `grad_mode` (vLLM uses
inference_mode). `bugs` plants the faults of `BUGS` by name.
"""

from __future__ import annotations

import dataclasses

import torch

from examples.vllm_shaped.cuda_graph import CUDAGraphWrapper
from examples.vllm_shaped.forward_context import BatchDescriptor, CUDAGraphMode, set_forward_context
from examples.vllm_shaped.model import AttentionMetadata, Config, Model
from parity.audit import emulated

BUGS = ("rebound_seq_lens", "stale_slot_mapping", "frozen_len", "padding_leak", "kv_realloc")


@dataclasses.dataclass
class InputBuffers:
    """Every tensor a graph reads, allocated once at its largest size; per-step code copies into slices."""
    input_ids: torch.Tensor         # [max_tokens]
    positions: torch.Tensor         # [max_tokens]
    query_start_loc: torch.Tensor   # [max_reqs + 1]
    seq_lens: torch.Tensor          # [max_reqs]
    slot_mapping: torch.Tensor      # [max_tokens]
    block_table: torch.Tensor       # [max_reqs, max_blocks_per_req]


class MetadataBuilder:
    """Writes a batch's attention metadata into the persistent buffers; the metadata is a view of them."""

    def __init__(self, buffers: InputBuffers, config: Config, bugs):
        self.buffers, self.config, self.bugs = buffers, config, bugs

    def build(self, seq_lens: list[int], query_lens: list[int], blocks: list[list[int]], num_reqs_padded: int,
              capture: bool = False) -> AttentionMetadata:
        b, c, n = self.buffers, self.config, len(seq_lens)
        b.block_table[:num_reqs_padded] = 0
        b.block_table[:n] = torch.tensor(blocks)
        num_tokens, padded_tokens = sum(query_lens), max(sum(query_lens), num_reqs_padded)
        if "rebound_seq_lens" in self.bugs:        # BUG: a new tensor instead of a copy into the buffer
            b.seq_lens = torch.zeros_like(b.seq_lens)
        b.seq_lens[:num_reqs_padded] = torch.tensor(seq_lens + [0] * (num_reqs_padded - n))
        starts = torch.tensor([0] + query_lens).cumsum(0)
        b.query_start_loc[:num_reqs_padded + 1] = torch.cat((starts, starts[-1:].expand(num_reqs_padded - n)))
        slots = [-1] * padded_tokens                       # PAD: padded (and capture's dummy) tokens write nothing
        for r, (seq_len, query_len) in enumerate(zip(seq_lens, query_lens) if not capture else ()):
            for j, pos in enumerate(range(seq_len - query_len, seq_len)):
                block = blocks[r][pos // c.block_size]
                slots[int(starts[r]) + j] = block * c.block_size + pos % c.block_size
        slot_mapping = b.slot_mapping[:padded_tokens]
        if "stale_slot_mapping" in self.bugs and not capture:   # BUG: fresh per-step tensor, buffer never written
            slot_mapping = torch.tensor(slots, device=slot_mapping.device)
        else:
            slot_mapping.copy_(torch.tensor(slots))
        return AttentionMetadata(b.query_start_loc[:num_reqs_padded + 1], b.seq_lens[:num_reqs_padded],
                                 slot_mapping, b.block_table[:num_reqs_padded], num_tokens, max(seq_lens))


@dataclasses.dataclass
class Request:
    prompt: list[int]
    max_new: int
    blocks: list[int]
    out: list[int] = dataclasses.field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.out)


class ModelRunner:
    def __init__(self, mode: CUDAGraphMode, *, device="cpu", grad_mode=torch.inference_mode, bugs=(),
                 sizes=(1, 2, 4), config: Config = Config()):
        self.mode, self.device, self.grad_mode, self.bugs = mode, torch.device(device), grad_mode, set(bugs)
        self.sizes, self.config = sizes, config
        self.graphs = torch.cuda if self.device.type == "cuda" else emulated
        self.model = Model(config, self.device, self.bugs)
        self.num_reqs = 0                       # real requests of the batch in flight
        with self.grad_mode():
            self._allocate()
        self.forward = self.model
        pool = self.graphs.graph_pool_handle()
        if mode == CUDAGraphMode.FULL:
            self.forward = CUDAGraphWrapper(self.model, mode, self.graphs, pool)
        elif mode == CUDAGraphMode.PIECEWISE:
            last = len(self.model.pieces) - 1
            self.model.pieces = [CUDAGraphWrapper(p, mode, self.graphs, pool, weak_ref_output=i == last)
                                 for i, p in enumerate(self.model.pieces)]

    def _allocate(self) -> None:
        c, d = self.config, self.device
        blocks_per_req = c.max_model_len // c.block_size
        ints = dict(dtype=torch.long, device=d)
        self.buffers = InputBuffers(torch.zeros(c.max_model_len, **ints), torch.zeros(c.max_model_len, **ints),
                                    torch.zeros(max(self.sizes) + 1, **ints), torch.zeros(max(self.sizes), **ints),
                                    torch.full((c.max_model_len,), -1, **ints),
                                    torch.zeros(max(self.sizes), blocks_per_req, **ints))
        self.builder = MetadataBuilder(self.buffers, c, self.bugs)
        self.initialize_kv_cache()

    def initialize_kv_cache(self) -> None:
        """One paged cache per layer, bound to its attention layer (vLLM's bind_kv_cache); the last slot is trash."""
        c = self.config
        shape = (2, c.num_blocks * c.block_size + 1, c.heads, c.hidden // c.heads)
        for layer in self.model.layers:
            layer.attn.kv_cache = torch.zeros(shape, device=self.device)

    def wrappers(self) -> list[CUDAGraphWrapper]:
        """The graph wrappers of this runner's mode (what the audit glue wraps)."""
        found = [self.forward] + list(self.model.pieces)
        return [w for w in found if isinstance(w, CUDAGraphWrapper)]

    def _run(self, input_ids: list[int], positions: list[int], meta, mode, num_tokens: int):
        b = self.buffers
        b.input_ids[:num_tokens] = torch.tensor(input_ids + [0] * (num_tokens - len(input_ids)))
        b.positions[:num_tokens] = torch.tensor(positions + [0] * (num_tokens - len(positions)))
        layers = {layer.attn.name: meta for layer in self.model.layers}
        descriptor = BatchDescriptor(num_tokens, uniform=True) if mode != CUDAGraphMode.NONE else None
        with set_forward_context(layers, descriptor, mode):
            return self.forward(b.input_ids[:num_tokens], b.positions[:num_tokens])

    def capture(self) -> "ModelRunner":
        """Every capture size, largest first: an eager warm-up, then the capture (vLLM's capture_model)."""
        with self.grad_mode():
            for bs in sorted(self.sizes, reverse=True):
                for mode in (CUDAGraphMode.NONE, self.mode):
                    meta = self.builder.build([1] * bs, [1] * bs, [[0]] * bs, bs, capture=True)
                    self._run([0] * bs, [0] * bs, meta, mode, bs)
        if "kv_realloc" in self.bugs:                           # BUG: the graphs keep writing the old cache
            with self.grad_mode():
                self.initialize_kv_cache()
        return self

    def _decode(self, reqs: list[Request]) -> torch.Tensor:
        n = len(reqs)
        bs = next(s for s in self.sizes if s >= n)
        self.num_reqs = n
        meta = self.builder.build([r.seq_len for r in reqs], [1] * n, [r.blocks for r in reqs], bs)
        logits = self._run([r.out[-1] for r in reqs], [r.seq_len - 1 for r in reqs], meta, self.mode, bs)
        return logits[:n].clone()

    def _prefill(self, r: Request) -> torch.Tensor:
        n = len(r.prompt)
        self.num_reqs = 1
        meta = self.builder.build([n], [n], [r.blocks], 1)
        logits = self._run(r.prompt, list(range(n)), meta, CUDAGraphMode.NONE, n)
        return logits[-1:].clone()

    def generate(self, prompts: list[list[int]], max_new: list[int]):
        """Greedy decode: (tokens per request, the logits of every step, in order)."""
        per_req = self.config.max_model_len // self.config.block_size
        reqs = [Request(p, m, list(range(i * per_req, (i + 1) * per_req)))
                for i, (p, m) in enumerate(zip(prompts, max_new))]
        steps = []
        with self.grad_mode():
            for r in reqs:
                steps.append(self._prefill(r))
                r.out.append(int(steps[-1][0].argmax()))
            while running := [r for r in reqs if len(r.out) < r.max_new]:
                steps.append(self._decode(running))
                for r, row in zip(running, steps[-1]):
                    r.out.append(int(row.argmax()))
        return [r.out for r in reqs], steps
