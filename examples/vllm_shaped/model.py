"""A tiny decoder shaped like a vLLM model: attention reads its metadata from the forward context.

`Attention` is vLLM's `unified_attention_with_output`: it writes this step's
keys and values into the paged KV cache at `slot_mapping` (PAD slot -1 goes
to a trash slot) and fills a preallocated output in place. The forward is
written as vLLM's piecewise split leaves it: `pieces[i]` is everything between
two attention calls (`submod_i`), each ending with the next attention's output
buffer allocated by `torch.empty`; attention runs between them.
"""

from __future__ import annotations

import dataclasses

import torch

from examples.vllm_shaped.forward_context import get_forward_context


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 64
    hidden: int = 32
    heads: int = 2
    layers: int = 2
    block_size: int = 4
    num_blocks: int = 24
    max_model_len: int = 24


@dataclasses.dataclass
class AttentionMetadata:
    """vLLM's CommonAttentionMetadata: tensors are views of the runner's persistent buffers."""
    query_start_loc: torch.Tensor     # [num_reqs_padded + 1]
    seq_lens: torch.Tensor            # [num_reqs_padded]
    slot_mapping: torch.Tensor        # [num_tokens_padded], -1: write nothing
    block_table: torch.Tensor         # [num_reqs_padded, max_blocks_per_req]
    num_actual_tokens: int
    max_seq_len: int


class Attention(torch.nn.Module):
    def __init__(self, name: str, config: Config, frozen_len: bool = False):
        super().__init__()
        self.name, self.config, self.frozen_len = name, config, frozen_len
        self.kv_cache: torch.Tensor | None = None      # [2, num_blocks * block_size + 1 (trash), heads, head_dim]

    def forward(self, q, k, v, out) -> None:
        meta = get_forward_context().attn_metadata[self.name]
        c, cache = self.config, self.kv_cache
        trash = cache.shape[1] - 1
        slots = torch.where(meta.slot_mapping >= 0, meta.slot_mapping, trash)
        cache[0].index_copy_(0, slots, k)
        cache[1].index_copy_(0, slots, v)
        num_tokens = q.shape[0]
        # request of each token, and its position: the last query_len positions of its sequence
        req = torch.searchsorted(meta.query_start_loc[1:], torch.arange(num_tokens, device=q.device), right=True)
        req = req.clamp(max=meta.seq_lens.shape[0] - 1)
        pos = meta.seq_lens[req] - (meta.query_start_loc[req + 1] - torch.arange(num_tokens, device=q.device))
        # BUG frozen_len: a Python int of this step's metadata bounds the keys (baked into a FULL graph)
        length = meta.max_seq_len if self.frozen_len else c.max_model_len
        key_pos = torch.arange(length, device=q.device)
        key_slots = meta.block_table[req][:, key_pos // c.block_size] * c.block_size + key_pos % c.block_size
        keys, values = cache[0][key_slots], cache[1][key_slots]          # [tokens, length, heads, head_dim]
        visible = (key_pos[None, :] <= pos[:, None]) & (key_pos[None, :] < meta.seq_lens[req][:, None])
        scores = torch.einsum("thd,tlhd->thl", q, keys) / keys.shape[-1] ** 0.5
        scores = scores.masked_fill(~visible[:, None, :], -1e30)
        probs = scores.softmax(-1) * visible[:, None, :]                   # padded tokens see nothing: zeros
        out.copy_(torch.einsum("thl,tlhd->thd", probs, values).reshape(out.shape))


def _weight(gen, device, *shape, scale=1.0):
    value = torch.randn(*shape, generator=gen) * scale / shape[-1] ** 0.5
    return torch.nn.Parameter(value.to(device), requires_grad=False)


class Layer(torch.nn.Module):
    def __init__(self, i: int, config: Config, gen, device, frozen_len: bool):
        super().__init__()
        h = config.hidden
        self.qkv, self.o = _weight(gen, device, 3 * h, h), _weight(gen, device, h, h)
        self.up, self.down = _weight(gen, device, 2 * h, h), _weight(gen, device, h, 2 * h)
        self.attn = Attention(f"layers.{i}.attn", config, frozen_len)


def _norm(x: torch.Tensor) -> torch.Tensor:
    """RMS norm computed in a wider dtype and cast back, as vLLM's RMSNorm does for half precision."""
    wide = x.to(torch.float64)
    return (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


class Piece(torch.nn.Module):
    """submod_i: the previous layer's attention output projection and MLP, then the next layer's q, k, v."""

    def __init__(self, model: "Model", i: int):
        super().__init__()
        self.i, self.config, self.name = i, model.config, f"submod_{i}"
        self.before = model.layers[i - 1] if i > 0 else None
        self.after = model.layers[i] if i < len(model.layers) else None
        self.embed = model.embed if i == 0 else None
        self.lm_head = model.lm_head if self.after is None else None
        self.rope = model.rope
        self.batch_norm = model.batch_norm

    def forward(self, x, attn_out, positions):
        if self.before is None:
            x = self.embed[x]                               # x: input_ids
        else:
            x = x + attn_out @ self.before.o.T
            x = x + torch.relu(_norm(x) @ self.before.up.T) @ self.before.down.T
        if self.after is None:
            x = _norm(x)
            if self.batch_norm:                             # BUG padding_leak: a scale shared by every token
                x = x / x.abs().amax()
            return x @ self.lm_head.T
        c = self.config
        heads, dim = c.heads, c.hidden // c.heads
        q, k, v = (_norm(x) @ self.after.qkv.T).split(c.hidden, -1)
        cos, sin = self.rope[0][positions], self.rope[1][positions]
        q, k = (t.view(-1, heads, dim) for t in (q, k))
        q, k = ((t * cos[:, None]) + (t.flip(-1) * sin[:, None]) for t in (q, k))
        out = torch.empty(x.shape[0], c.hidden, dtype=x.dtype, device=x.device)
        return x, q.contiguous(), k.contiguous(), v.view(-1, heads, dim).contiguous(), out


class Model(torch.nn.Module):
    def __init__(self, config: Config, device, bugs=frozenset()):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.config, self.name = config, "model"
        self.embed = _weight(gen, device, config.vocab, config.hidden, scale=config.hidden ** 0.5)
        self.lm_head = _weight(gen, device, config.vocab, config.hidden)
        self.layers = torch.nn.ModuleList(Layer(i, config, gen, device, "frozen_len" in bugs)
                                          for i in range(config.layers))
        dim = config.hidden // config.heads
        angles = torch.arange(config.max_model_len)[:, None] / 100 ** (torch.arange(dim) / dim)
        self.rope = torch.nn.Parameter(torch.stack((angles.cos(), angles.sin())).to(device), requires_grad=False)
        self.batch_norm = "padding_leak" in bugs
        # NOTE: a plain list: PIECEWISE replaces each piece by its graph wrapper (vLLM's split graph's submod_i).
        self.pieces = [Piece(self, i) for i in range(config.layers + 1)]

    def forward(self, input_ids, positions):
        """Logits [num_tokens, vocab]; pieces may be graph wrappers (PIECEWISE), attention always runs here."""
        x, attn_out = input_ids, None
        for piece, layer in zip(self.pieces, self.layers):
            x, q, k, v, attn_out = piece(x, attn_out, positions)
            layer.attn(q, k, v, attn_out)
        return self.pieces[-1](x, attn_out, positions)
