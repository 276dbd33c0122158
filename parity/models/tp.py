"""Tensor parallelism of the target: which rank this process is, and the one collective its layers run.

Megatron's split, on `torch.distributed` (gloo on the CPU, NCCL on GPUs):
q/k/v and gate/up are column-parallel (each rank keeps its heads' and its
intermediate slice's rows, KV heads split over the ranks), o_proj and
down_proj row-parallel (each rank keeps the matching columns, and its partial
product is summed over the ranks by one all-reduce). The embedding, the final
norm and lm_head are replicated: every rank computes the whole logits, so the
sampler and the drafter (replicated too) see the same values on every rank
with no gather. `shard_target` slices a full checkpoint at load (docs/tp.md).

The all-reduce is a torch custom op (`parity::all_reduce`): the emulated
graph backend's recorder sees it as one op with its input and a fresh output
and replays it on whatever the captured input holds then; CUDA capture
records the NCCL kernel. With `--tp-all-reduce registered` the row-parallel
layers reduce through registered buffers instead (`models.tp_registered`).
At TP=1 nothing here is used: no op is added.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parity.errors import ParityInputError
from parity.models.tp_registered import COMMS, RegisteredAllReduce, registered_all_reduce_

GROUP = "tp"
# name -> process group the all-reduce op reduces over (an op argument must be a plain value).
_GROUPS: dict[str, object] = {}


@dataclass
class TpContext:
    """This process's place in the tensor-parallel group."""

    rank: int
    world: int
    timeout: timedelta
    store: object = None          # the key-value store the ranks exchange their descriptors through
    forwards: int = 0             # descriptor exchanges so far in this process (every rank counts alike)
    run_forwards: int = 0         # forwards so far in the engine run in progress
    agreements: int = 0           # decisions agreed so far in this process (`graphs.tp_agree`)
    all_reduce: str = "collective"  # or "registered": the custom all-reduce of `models.tp_registered`


_CURRENT: list[TpContext] = []


def activate(ctx: TpContext, group) -> None:
    """Make this process a rank of a TP group (after `dist.init_process_group`)."""
    _GROUPS[GROUP] = group
    _CURRENT[:] = [ctx]


def deactivate() -> None:
    """This process is no rank any more (TP=1 again)."""
    _CURRENT.clear()
    _GROUPS.clear()
    COMMS.clear()


def peer_storages() -> set[int]:
    """The storages of memory other ranks own that this rank maps (their registered all-reduce heaps)."""
    return {t.untyped_storage().data_ptr() for comm in COMMS.values() for t in comm.foreign}


def current() -> TpContext | None:
    """This process's TP context; None outside a TP run (TP=1)."""
    return _CURRENT[0] if _CURRENT else None


@torch.library.custom_op("parity::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor, group: str) -> torch.Tensor:
    """The sum of x over every rank of `group` (a fresh tensor; x is left as it is)."""
    out = x.clone()
    dist.all_reduce(out, group=_GROUPS[group])
    return out


@all_reduce.register_fake
def _(x, group):
    return torch.empty_like(x)


class RowParallelLinear(nn.Module):
    """A linear whose input features are split over the ranks: local GEMM, then the all-reduce (then the bias).

    With a registered all-reduce (`comm`), the all-reduce runs in place in this layer's registered buffer
    `out` (key `key` of the registration table): the partial product is staged into it, the sum comes back in it.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.comm, self.key, self.out = None, -1, None     # set by `register_all_reduce`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x, self.weight)
        if self.comm is None or not self.comm.fits(partial.numel()):
            out = all_reduce(partial, GROUP)
        else:
            staged = self.out[:partial.numel()]
            staged.copy_(partial.reshape(-1))
            registered_all_reduce_(staged, self.comm.peers, self.comm.table, self.key, GROUP)
            out = staged.view(partial.shape)
        return out if self.bias is None else out + self.bias


def check_divisible(config, world: int) -> None:
    """Refuse, in one line, a model whose heads or MLP width do not split evenly over `world` ranks."""
    heads = config.num_attention_heads
    kv_heads = config.num_key_value_heads or heads
    for name, value in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads),
                        ("intermediate_size", config.intermediate_size)):
        if value % world:
            raise ParityInputError(f"--tp {world}: the target's {name} = {value} does not divide over {world} "
                                   "ranks (each rank keeps whole heads and an equal MLP slice)")


def _rows(linear: nn.Linear, start: int, stop: int) -> None:
    linear.weight = nn.Parameter(linear.weight.detach()[start:stop].clone(), requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.detach()[start:stop].clone(), requires_grad=False)
    linear.out_features = stop - start


def _row_parallel(linear: nn.Linear, start: int, stop: int) -> RowParallelLinear:
    bias = None if linear.bias is None else linear.bias.detach().clone()
    return RowParallelLinear(linear.weight.detach()[:, start:stop].clone(), bias)


def shard_config(config, world: int):
    """The per-rank config: heads, KV heads and MLP width divided by `world` (head_dim kept)."""
    check_divisible(config, world)
    local = copy.deepcopy(config)
    local.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    local.num_attention_heads = config.num_attention_heads // world
    local.num_key_value_heads = (config.num_key_value_heads or config.num_attention_heads) // world
    local.intermediate_size = config.intermediate_size // world
    return local


def shard_target(target, rank: int, world: int):
    """Keep this rank's slices of every decoder layer of a full `TargetModel`, in place; returns it."""
    local = shard_config(target.config, world)
    d = local.head_dim
    q, kv, inter = local.num_attention_heads * d, local.num_key_value_heads * d, local.intermediate_size
    for layer in target.decoder_layers():
        attn, mlp = layer.self_attn, layer.mlp
        _rows(attn.q_proj, rank * q, (rank + 1) * q)
        _rows(attn.k_proj, rank * kv, (rank + 1) * kv)
        _rows(attn.v_proj, rank * kv, (rank + 1) * kv)
        attn.o_proj = _row_parallel(attn.o_proj, rank * q, (rank + 1) * q)
        _rows(mlp.gate_proj, rank * inter, (rank + 1) * inter)
        _rows(mlp.up_proj, rank * inter, (rank + 1) * inter)
        mlp.down_proj = _row_parallel(mlp.down_proj, rank * inter, (rank + 1) * inter)
        attn.config = mlp.config = local
        attn.num_key_value_groups = local.num_attention_heads // local.num_key_value_heads
    target.config = target.hf.config = target.hf.model.config = local
    target.tp_sharded = (rank, world)
    return target.fuse_layers()


def register_all_reduce(target, ctx: TpContext):
    """Give every row-parallel layer of a sharded target, on its device, a buffer of this rank's registered
    all-reduce (one key a layer, in module order: the same on every rank)."""
    layers = [m for m in target.modules() if isinstance(m, RowParallelLinear)]
    weight = target.lm_head.weight
    comm = RegisteredAllReduce(GROUP, len(layers), target.config.hidden_size, weight.dtype, weight.device, ctx)
    for key, layer in enumerate(layers):
        layer.comm, layer.key = comm, key
        layer.out = comm.register(key)
    target.tp_registered = comm
    return target


def shard_if_parallel(target):
    """In a rank of a TP run: this rank's slices of `target` (TP=1, or built sharded already: not sliced again),
    with registered all-reduce buffers when the run asks for them (`--tp-all-reduce registered`)."""
    ctx = current()
    if ctx is None or ctx.world == 1:
        return target
    if not getattr(target, "tp_sharded", None):
        shard_target(target, ctx.rank, ctx.world)
    if ctx.all_reduce == "registered" and getattr(target, "tp_registered", None) is None:
        register_all_reduce(target, ctx)
    return target


def rank_slice(full: torch.Tensor, size: torch.Size, rank: int) -> torch.Tensor:
    """This rank's block of a full tensor along the one dimension its per-rank `size` is smaller in."""
    dims = [d for d in range(full.dim()) if full.shape[d] != size[d]]
    if not dims:
        return full
    dim, width = dims[0], size[dims[0]]
    return full.narrow(dim, rank * width, width).clone()


def rank_config_dict(config: dict) -> dict:
    """A config.json dict as one rank of the current TP run holds it (heads, KV heads, MLP width divided)."""
    ctx = current()
    if ctx is None or ctx.world == 1:
        return config
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    return {**config, "head_dim": config.get("head_dim") or config["hidden_size"] // heads,
            "num_attention_heads": heads // ctx.world, "num_key_value_heads": kv_heads // ctx.world,
            "intermediate_size": config["intermediate_size"] // ctx.world}
