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
refuses, so stale weights can never be used; a model whose layers run fused
(`FusedLayers`: the target, every draft head) fuses again after every move.
The fused weight carries no gradient: the projections keep their
`requires_grad` (a head trains through its modules, which read them), and
`fused` refuses a forward that would need one (train mode, grad enabled).
"""

from __future__ import annotations

import torch
from torch import nn

QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")
_ATTR = "_parity_fused"
_ROWS = "_parity_row_kernels"


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
        m.weight = nn.Parameter(weight[first:first + rows], requires_grad=m.weight.requires_grad)
        if has_bias:
            m.bias = nn.Parameter(bias[first:first + rows], requires_grad=m.bias.requires_grad)
        first += rows
    owner.__dict__[_ATTR] = (weight, bias)


def fused(owner: nn.Module, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused (weight, bias) of `owner`, checked to still be what its linears hold."""
    if not _still_fused(owner, names):
        raise RuntimeError(f"{type(owner).__name__}.{'/'.join(names)}: weights changed after they were fused; "
                           "call fuse_layers() again")
    if owner.training and torch.is_grad_enabled() and any(p.requires_grad for n in names
                                                          for p in getattr(owner, n).parameters()):
        raise RuntimeError(f"{type(owner).__name__}.{'/'.join(names)}: training through the fused weight, which "
                           "carries no gradient; train through the modules' own forward")
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


def fuse_projections(layers, rows: bool = False) -> None:
    """Fuse q/k/v and gate/up of every decoder layer in `layers`; `rows`: their projections run in the few-row
    kernels (`row_kernels`)."""
    for layer in layers:
        fuse(layer.self_attn, QKV)
        fuse(layer.mlp, GATE_UP)
        for owner in (layer.self_attn, layer.mlp):
            owner.__dict__[_ROWS] = rows


def row_kernels(owner: nn.Module) -> bool:
    """Whether `owner`'s projections (an attention or MLP module of a fused layer) run in the few-row kernels:
    a draft head's (`FusedLayers.ROW_KERNELS`)."""
    return owner.__dict__.get(_ROWS, False)


class FusedLayers(nn.Module):
    """A model whose `decoder_layers()` run in the fused ops: fused when built and again after every move.

    Call `fuse_layers()` after replacing the layers' parameters (`load_state_dict(assign=True)`).
    """

    # A draft head forwards one to a few rows per request: its projections run in the few-row kernels
    # (`fused_ops.row_linear`); the target's stay with cuBLAS.
    ROW_KERNELS = False

    def decoder_layers(self) -> list[nn.Module]:
        raise NotImplementedError

    def fuse_layers(self):
        fuse_projections(self.decoder_layers(), self.ROW_KERNELS)
        return self

    def _apply(self, fn, recurse=True):
        # A move (.to, .cuda, a cast) gives every parameter its own new tensor: fuse them again.
        super()._apply(fn, recurse)
        return self.fuse_layers()
