"""One weight for q/k/v and one for gate/up: a layer's projections as two GEMMs where it had five.

`fuse_projections` concatenates, per decoder layer, the q, k and v
projections (outputs side by side) and the gate and up projections, and
rebinds each original parameter as a view of its rows in the fused weight:
the memory is the same, the checkpoint keys and `state_dict` are the same
(shared storage; the savers clone it), and writing into a projection's
weight writes the fused one. One GEMM over the concatenated weight gives
each output column the dot products the separate GEMMs give (checked bit for
bit on the CPU), and on the GPU it reads the weights in fewer, larger
kernels.

A module moved or re-assigned afterwards no longer views the fused weight:
`fused` notices (a projection's storage is not the fused one) and
refuses, so stale weights can never be used; `TargetModel` fuses again after
every move.
"""

from __future__ import annotations

import torch
from torch import nn

QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")
_ATTR = "_parity_fused"


def fuse(owner: nn.Module, names: tuple[str, ...]) -> None:
    """Concatenate the weights (and biases) of `owner`'s linears `names`; rebind theirs as views.

    Nothing to do when they still view the fused weight (a move that moved nothing).
    """
    if _still_fused(owner, names):
        return
    linears = [getattr(owner, name) for name in names]
    weight = torch.cat([m.weight.detach() for m in linears])
    has_bias = linears[0].bias is not None
    bias = torch.cat([m.bias.detach() for m in linears]) if has_bias else None
    first = 0
    for m in linears:
        rows = m.weight.shape[0]
        m.weight = nn.Parameter(weight[first:first + rows], requires_grad=False)
        if has_bias:
            m.bias = nn.Parameter(bias[first:first + rows], requires_grad=False)
        first += rows
    owner.__dict__[_ATTR] = (weight, bias)


def fused(owner: nn.Module, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused (weight, bias) of `owner`, checked to still be what its linears hold."""
    if not _still_fused(owner, names):
        raise RuntimeError(f"{type(owner).__name__}.{'/'.join(names)}: weights changed after they were fused; "
                           "call fuse_projections() again")
    return owner.__dict__[_ATTR]


def _still_fused(owner: nn.Module, names: tuple[str, ...]) -> bool:
    """Every linear's weight (and bias) is a view of the owner's fused one."""
    weight, bias = owner.__dict__.get(_ATTR, (None, None))
    if weight is None:
        return False
    for name in names:
        linear = getattr(owner, name)
        if linear.weight.untyped_storage().data_ptr() != weight.untyped_storage().data_ptr():
            return False
        if bias is not None and (linear.bias is None
                                 or linear.bias.untyped_storage().data_ptr() != bias.untyped_storage().data_ptr()):
            return False
    return True


def fuse_projections(layers) -> None:
    """Fuse q/k/v and gate/up of every decoder layer in `layers`."""
    for layer in layers:
        fuse(layer.self_attn, QKV)
        fuse(layer.mlp, GATE_UP)
