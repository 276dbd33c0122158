"""A recurrent mixer for hybrid targets: a Mamba2-like (SSD) layer in place of some layers' attention.

Per head h, a state S [dk, dv] decays by a per-token scalar and takes each
token's outer product:

    S_t = exp(a_t) S_{t-1} + k_t^T v_t,      y_t = q_t S_t,      a_t = -softplus(a_proj(x_t) + DECAY_BIAS) <= 0

(Mamba2's state-space dual with a scalar decay per head; q and k L2-normed as
in Gated DeltaNet). It is written in its parallel form, so a whole padded
batch is a few fixed-shape tensor ops with no per-token loop and no host
value: for tokens s <= t of one row, S_t = exp(c_t) S0 + sum_s exp(c_t - c_s)
k_s^T v_s with c the row's running sum of a. Rows come from query_start_loc
(padded tokens belong to no row and never reach a live token).

The engine's state (`parity/engine/state_slots.py`) reaches the mixer on the
metadata: `meta.states` (committed states per slot [num_slots + 1, H, dk, dv]
and provisional states per slot and draft position [num_slots + 1, L, ...];
the last slot is the sentinel), `meta.state_index` (each row's committed slot,
read) and `meta.spec_index` (each row's slot for provisional states, written).
Every row, padded rows included, writes the states after its last L tokens
into its spec slot (before a row's first token: its initial state); the engine
commits the accepted position's state after sampling and drops the others.
Called as transformers' attention (`forward`, calibration and the oracle) it
runs each sequence from a zero state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DECAY_BIAS = -2.0          # softplus(-2) = 0.127: a typical token keeps ~88% of the state


def recurrent_layers(config) -> tuple[int, ...]:
    """The layer ids whose attention is a recurrent mixer (config.json `recurrent_layers`; none: attention-only)."""
    return tuple(getattr(config, "recurrent_layers", None) or ())


def mixer_dims(config) -> tuple[int, int, int]:
    """(heads, key dim, value dim) of the recurrent mixers of `config`."""
    heads = getattr(config, "recurrent_heads", None) or config.num_key_value_heads
    dim = getattr(config, "recurrent_head_dim", None) or min(64, config.hidden_size // config.num_attention_heads)
    return heads, dim, dim


class RecurrentMixer(nn.Module):
    """Stands in for a decoder layer's self_attn: q/k/v/o projections like attention's, plus the decay."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.heads, self.key_dim, self.value_dim = mixer_dims(config)
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.heads * self.key_dim, bias=False)
        self.k_proj = nn.Linear(h, self.heads * self.key_dim, bias=False)
        self.v_proj = nn.Linear(h, self.heads * self.value_dim, bias=False)
        self.a_proj = nn.Linear(h, self.heads, bias=False)
        self.o_proj = nn.Linear(self.heads * self.value_dim, h, bias=False)

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        """transformers' call ([B, S, h]): each sequence from a zero state. Returns (output, None)."""
        outs = []
        for x in hidden_states:
            qsl = torch.tensor([0, x.shape[0]], device=x.device)
            zero = x.new_zeros((1, self.heads, self.key_dim, self.value_dim), dtype=torch.float32)
            outs.append(self._mix(x, qsl, zero, None)[0])
        return torch.stack(outs), None

    def mix(self, x: torch.Tensor, meta) -> torch.Tensor:
        """The engine's call on a padded batch x [T, h]: the output [T, h]; provisional states to meta.states."""
        states = meta.states
        index = meta.state_index
        start = states.state[self.layer_idx].index_select(0, index)      # [R, H, dk, dv]
        out, ends = self._mix(x, meta.query_start_loc, start, states.positions)
        states.spec[self.layer_idx].index_copy_(0, meta.spec_index, ends)
        return out

    def _mix(self, x: torch.Tensor, qsl: torch.Tensor, start: torch.Tensor, positions: int | None):
        tokens, heads = x.shape[0], self.heads
        q = F.normalize(self.q_proj(x).float().view(tokens, heads, -1), dim=-1)
        k = F.normalize(self.k_proj(x).float().view(tokens, heads, -1), dim=-1)
        v = self.v_proj(x).float().view(tokens, heads, -1)
        a = -F.softplus(self.a_proj(x).float() + DECAY_BIAS)                         # [T, H]
        rows = start.shape[0]
        t = torch.arange(tokens, device=x.device)
        row = (t.unsqueeze(1) >= qsl[1:].unsqueeze(0)).sum(1)                         # [T], rows: padded tokens
        same = (row.unsqueeze(1) == row.unsqueeze(0)) & (t.unsqueeze(0) <= t.unsqueeze(1)) & (row < rows).unsqueeze(1)
        c = same.float() @ a                                                          # [T, H] running decay
        decay = torch.where(same.unsqueeze(2), c.unsqueeze(1) - c.unsqueeze(0), float("-inf")).exp()   # [T, T, H]
        scores = torch.einsum("thk,shk->tsh", q, k) * decay
        y = torch.einsum("tsh,shv->thv", scores, v)
        live = row < rows
        mine = row.clamp(max=rows - 1)
        from_start = torch.einsum("thk,rhkv->thrv", q, start)                         # [T, H, R, dv]
        from_start = from_start.gather(2, mine.view(tokens, 1, 1, 1).expand(tokens, heads, 1, from_start.shape[3]))
        y = y + torch.where(live.view(tokens, 1, 1), from_start.squeeze(2) * c.exp().unsqueeze(2), 0.0)
        out = self.o_proj(y.reshape(tokens, -1).to(x.dtype))
        if positions is None:
            return out, None
        return out, self._ends(qsl, start, decay, c, k, v, positions)

    @staticmethod
    def _ends(qsl, start, decay, c, k, v, positions: int) -> torch.Tensor:
        """Each row's states after its last `positions` tokens: [R, L, H, dk, dv]; before its first: its start."""
        rows, tokens = start.shape[0], k.shape[0]
        ends = qsl[1:].unsqueeze(1) - positions + torch.arange(positions, device=qsl.device)    # [R, L]
        valid = ends >= qsl[:-1].unsqueeze(1)
        at = ends.clamp(0, tokens - 1).reshape(-1)
        grown = torch.einsum("eth,thk,thv->ehkv", decay.index_select(0, at), k, v)
        kept = start.repeat_interleave(positions, dim=0) * c.index_select(0, at).exp().view(-1, c.shape[1], 1, 1)
        states = (grown + kept).view(rows, positions, *start.shape[1:])
        return torch.where(valid.view(rows, positions, 1, 1, 1), states, start.unsqueeze(1))


def hybridize(hf_model) -> None:
    """Put a RecurrentMixer in place of self_attn in every layer `recurrent_layers(config)` names."""
    config = hf_model.config
    for idx in recurrent_layers(config):
        layer = hf_model.model.layers[idx]
        param = next(layer.parameters())
        layer.self_attn = RecurrentMixer(config, idx).to(device=param.device, dtype=param.dtype)
