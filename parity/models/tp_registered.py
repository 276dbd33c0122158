"""The registered all-reduce (`parity run --tp N --tp-all-reduce registered`): a custom all-reduce through
buffers every rank can read, as vLLM's custom all-reduce and symmetric-memory all-reduces work.

Each rank owns a symmetric heap every peer maps (CPU: a shared file mapping per
rank, the ranks forked on one host; CUDA: `torch.distributed._symmetric_memory`,
peer-to-peer), cut into equal slots. Each row-parallel layer registers one slot
as its **registered buffer** (`RowParallelLinear.out`): the registration table
(`table`, a device tensor, like vLLM's `rank_data`) says where key k's buffer
sits, the same place on every rank (the heap is symmetric). One call:

1. the layer stages its partial product into its buffer (`out[:n].copy_`);
2. `parity::registered_all_reduce_` waits for every rank (a barrier), reads
   every rank's buffer at the place the table registers for k (read at run
   time, as a custom all-reduce kernel reads its peers' pointers), sums them in
   rank order, waits again, and writes the sum back into the buffer it was given;
3. the layer reads the sum from its buffer.

In a graph, steps 1 and 3 and the buffer handed to step 2 are the addresses
captured; the table is read at replay. So a graph stays right only while the
buffer it captured is the one registered: re-registering a key at another slot
after capture leaves the graph staging into the old slot while every rank reads
the new one. Calls larger than a slot take the plain collective
(`models.tp.all_reduce`), as vLLM's custom all-reduce falls back to NCCL.
"""

from __future__ import annotations

import collections
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

SLOT_TOKENS = 128          # rows of the hidden size one slot holds: larger calls take the plain collective
SPARE_SLOTS = 2            # beyond two per key: every key can be registered anew once, and then some
COMMS: dict[str, "RegisteredAllReduce"] = {}
_MADE = [0]                # heaps mapped so far in this process (every rank maps them in the same order)


class RegisteredAllReduce:
    """One rank's symmetric heap, its peers' mappings of theirs, and the registration table."""

    def __init__(self, group: str, keys: int, width: int, dtype: torch.dtype, device: torch.device, ctx):
        self.group, self.width, self.slot = group, width, SLOT_TOKENS * width
        slots = 2 * keys + SPARE_SLOTS
        self.heap, self.peers, self._barrier = _map_heaps(slots * self.slot, dtype, device, ctx)
        own = self.heap.untyped_storage().data_ptr()
        # The peers' heaps: their memory, which only they write (a bisection restores its own state only).
        self.foreign = [p for p in self.peers if p.untyped_storage().data_ptr() != own]
        self.table = torch.zeros(keys, dtype=torch.long, device=device)     # key -> offset of its buffer
        self.arange = torch.arange(self.slot, device=device)
        self._free = collections.deque(range(slots))
        self._held: dict[int, int] = {}
        COMMS[group] = self

    def register(self, key: int) -> torch.Tensor:
        """Give `key` a free slot, write it into the table, release the slot it held: its buffer (a view)."""
        slot = self._free.popleft()
        if key in self._held:
            self._free.append(self._held[key])
        self._held[key] = slot
        self.table[key] = slot * self.slot
        return self.heap[slot * self.slot:(slot + 1) * self.slot]

    def fits(self, numel: int) -> bool:
        return numel <= self.slot

    def barrier(self) -> None:
        self._barrier()


@torch.library.custom_op("parity::registered_all_reduce_", mutates_args=("buffer",))
def registered_all_reduce_(buffer: torch.Tensor, peers: list[torch.Tensor], table: torch.Tensor, key: int,
                           group: str) -> None:
    """Sum, over every rank, the registered buffer of `key` (where `table` says it is) into `buffer`."""
    comm = COMMS[group]
    comm.barrier()                          # every rank has staged its partial
    where = table[key] + comm.arange[:buffer.numel()]
    total = peers[0].index_select(0, where)
    for peer in peers[1:]:
        total = total + peer.index_select(0, where)
    comm.barrier()                          # every rank has read: a buffer may be written again
    buffer.copy_(total)


@registered_all_reduce_.register_fake
def _(buffer, peers, table, key, group):
    return None


def _map_heaps(numel: int, dtype: torch.dtype, device: torch.device, ctx):
    """(this rank's heap, every rank's heap as this rank maps it, a barrier over the ranks)."""
    if device.type == "cuda":
        import torch.distributed._symmetric_memory as symm_mem

        # NOTE: not run on GPUs yet (tests/test_tp_faults.py's gpu tests are the first).
        symm_mem.enable_symm_mem_for_group(dist.group.WORLD.group_name)
        heap = symm_mem.empty(numel, dtype=dtype, device=device)
        handle = symm_mem.rendezvous(heap, dist.group.WORLD)
        peers = [handle.get_buffer(r, (numel,), dtype) for r in range(ctx.world)]
        return heap, peers, lambda: handle.barrier(channel=0)
    # One file per rank in a folder rank 0 makes; mapped by every rank, then unlinked (the mappings stay).
    exchange = f"heap/{_MADE[0]}/folder"
    _MADE[0] += 1
    if ctx.rank == 0:
        ctx.store.set(exchange, tempfile.mkdtemp(prefix="parity-heap-"))
    folder = Path(ctx.store.get(exchange).decode())
    heap = torch.from_file(str(folder / f"rank{ctx.rank}"), shared=True, size=numel, dtype=dtype)
    heap.zero_()
    dist.barrier()
    peers = [heap if r == ctx.rank else torch.from_file(str(folder / f"rank{r}"), shared=True, size=numel,
                                                           dtype=dtype) for r in range(ctx.world)]
    dist.barrier()
    if ctx.rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
    return heap, peers, dist.barrier
