"""Host staging for the overlapped loop: pinned host slots, a copy stream, events.

Every host-built value a forward reads goes host -> slot -> device: the builder
writes a buffer's values into that buffer's host slot (`stage`), the copies of
what was staged are issued on the copy stream after the compute stream's work so
far (`flush`), and the compute stream waits each copy's `ready` event before the
forward that reads it (`consume`). Outputs the host reads later are copied out the same
way (`readback`): a non-blocking copy into a slot of their own on a readback stream, whose
event the consumer waits before reading, and which the compute stream waits
(`before_overwrite`) before a later forward rewrites the rows it reads.

Two events per buffer: `ready` (the copy landed: the forward may read it) and
`free` (the copy read its source: the host may rewrite the slot, the device may
rewrite read-back rows). `landed` is the experiments' own mark right after each
copy: never waited on unless `sync` asks, so it changes nothing by itself.

`sync` (key -> SYNC, REUSE or CONSUME) is the STAGING_RACE experiment's lever:
SYNC makes a key's staging race-free without a host wait: its copy runs on the compute
stream, ordered with the forwards, from a slot of its own that is never rewritten (a
blocking copy, as the synchronous loop makes, is a host sync that stalls every other copy
too: on CUDA that changes the timing of every race, and the experiment would no longer
vary one buffer; measured on an H100, where it named input_ids for every fault); REUSE waits the key's copy before its slot or read-back
rows are written again; CONSUME waits it before the forward that reads it. Keys are
"<owner>.<buffer>".
"""

from __future__ import annotations

import torch

from parity.graphs import streams

SYNC, REUSE, CONSUME = "sync", "reuse", "consume"


class Stager:
    def __init__(self, device: torch.device, sync: dict[str, str] | None = None):
        self.device = torch.device(device)
        self.G = streams.api(self.device)
        self.copy_stream = self.G.Stream(device=self.device)
        self.readback_stream = self.G.Stream(device=self.device)
        self.sync = dict(sync or {})
        self.slots: dict[str, torch.Tensor] = {}
        self.slot_storages: set[int] = set()                     # every slot's memory, grown ones included
        self.staged: dict[str, tuple[torch.Tensor, int]] = {}   # key -> (destination, entries): copy not issued
        self.issued: list[str] = []                              # copies the next forward must wait for
        self.ready: dict[str, object] = {}
        self.free: dict[str, object] = {}
        self.landed: dict[str, object] = {}
        self.keys: dict[str, None] = {}                          # every key staged or read back, in order
        self.readers: dict[str, dict[str, None]] = {}            # key -> the phases of the forwards it feeds
        self.active = False                                      # staging only while the loop runs

    def phases(self) -> dict[str, list[str]]:
        """Every key staged or read back -> the phases of the forwards it feeds (or whose output it reads)."""
        return {key: list(self.readers.get(key, {})) for key in self.keys}

    # --- host -> device -----------------------------------------------------------------------

    def slot(self, key: str, like: torch.Tensor, on_device: bool = False) -> torch.Tensor:
        """The slot of `key`, at least as large as `like`: on the host (page-locked with a CUDA device), or
        `on_device` beside `like`."""
        self.keys[key] = None
        fresh = self.sync.get(key) == SYNC       # a slot never rewritten: nothing for the host to wait for
        if fresh or key not in self.slots or self.slots[key].numel() < like.numel():
            if on_device:
                self.slots[key] = torch.empty(like.numel(), dtype=like.dtype, device=like.device)
            else:
                self.slots[key] = torch.empty(like.numel(), dtype=like.dtype, pin_memory=streams.pinned(self.device))
            self.slot_storages.add(self.slots[key].untyped_storage().data_ptr())
        return self.slots[key]

    def stage(self, key: str, destination: torch.Tensor, values: torch.Tensor) -> None:
        """Write `values` into `key`'s slot; the copy into `destination[:len(values)]` waits for `flush`."""
        slot = self.slot(key, destination)
        self.before_rewrite(key)
        n = values.numel()
        slot[:n].copy_(values.reshape(-1))
        self.staged[key] = (destination, n)

    def before_rewrite(self, key: str) -> None:
        """The host is about to rewrite `key`'s slot: wait until the last copy that reads it read it."""
        self.wait_reusable(key)
        if self.sync.get(key) == REUSE and key in self.landed:
            self.landed[key].synchronize()

    def wait_reusable(self, key: str) -> None:
        """Wait for `key`'s `free` event, unless it has completed (a query is no sync)."""
        if key in self.free and not self.free[key].query():
            self.free[key].synchronize()

    def flush(self) -> None:
        """Issue the copies of everything staged, ordered after the compute stream's work so far."""
        compute = self.G.current_stream(self.device)
        for key, (destination, n) in self.staged.items():
            target, source = destination.view(-1)[:n], self.slots[key][:n]
            if self.sync.get(key) == SYNC:
                target.copy_(source, non_blocking=True)    # ordered with the forwards, no host sync
                self.mark(key, compute)
            else:
                self.issue(key, target, source, self.copy_stream)
            self.issued.append(key)
        self.staged.clear()

    def issue(self, key: str, target: torch.Tensor, source: torch.Tensor, s) -> None:
        """The non-blocking copy of `source` (a slot) into `target` on stream `s`, after the compute stream's
        work so far, and its events."""
        s.wait_stream(self.G.current_stream(self.device))
        with self.G.stream(s):
            target.copy_(source, non_blocking=True)
        self.mark(key, s)

    def mark(self, key: str, s) -> None:
        """Events after `key`'s copy on stream `s`: it landed, and it read its slot."""
        event = self.G.Event()
        event.record(s)
        self.ready[key] = self.free[key] = self.landed[key] = event

    def consume(self, phase: str) -> None:
        """The compute stream waits for every issued copy before the `phase` forward that reads them."""
        issued, self.issued = self.issued, []
        for key in issued:
            self.readers.setdefault(key, {})[phase] = None
        self.wait_ready(issued)
        for key in issued:
            if self.sync.get(key) == CONSUME:
                self.landed[key].synchronize()

    def wait_ready(self, keys: list[str]) -> None:
        compute = self.G.current_stream(self.device)
        for key in keys:
            compute.wait_event(self.ready[key])

    # --- device -> host -----------------------------------------------------------------------

    def readback(self, key: str, source: torch.Tensor, phase: str):
        """A non-blocking copy of `source` (an output of the `phase` forward) into `key`'s slot, on the readback
        stream after the compute stream's work so far. Returns (view, event): read the view only after the
        event. The slot sits beside `source` (on the device), so what the host computes from it later is
        computed by the same kernels as in the synchronous loop, bit for bit."""
        self.readers.setdefault(key, {})[phase] = None
        self.before_rewrite(key)
        slot = self.slot(key, source, on_device=True)
        target = slot[: source.numel()]
        compute = self.G.current_stream(self.device)
        if self.sync.get(key) == SYNC:
            target.copy_(source.reshape(-1))
            self.mark(key, compute)
        else:
            s = self.readback_stream
            s.wait_stream(compute)
            if source.is_cuda:
                source.record_stream(s)      # the allocator must not hand the rows out before the readback read them
            with self.G.stream(s):
                target.copy_(source.reshape(-1), non_blocking=True)
            self.mark(key, s)
        return target.view(source.shape), self.ready[key]

    def before_overwrite(self, key: str) -> None:
        """A forward is about to rewrite the rows `key` reads back: the compute stream waits for the readback."""
        if key in self.free:
            self.G.current_stream(self.device).wait_event(self.free[key])
        if self.sync.get(key) == REUSE and key in self.landed:
            self.landed[key].synchronize()


class StagedWrites:
    """A metadata builder whose host-built values reach the buffers through a Stager while it is active."""

    stager: Stager | None = None
    owner_name = ""

    def _fill(self, name, values, pad, num_tokens):
        stager = self.stager
        if stager is None or not stager.active:
            return super()._fill(name, values, pad, num_tokens)
        inert = self.buffers.spec(name).inert_value(num_tokens)
        host = torch.tensor(values + [inert] * pad, dtype=torch.int64)
        stager.stage(f"{self.owner_name}.{name}", self.buffers[name], host)

    def store_block_table(self, table):
        stager = self.stager
        if stager is None or not stager.active:
            return super().store_block_table(table)
        stager.stage(f"{self.owner_name}.block_table", self.buffers["block_table"], table)


def staged(builder, stager: Stager, owner_name: str):
    """`builder` made to stage its writes through `stager` (its class gains StagedWrites in front)."""
    cls = builder.__class__
    builder.__class__ = type(f"Staged{cls.__name__}", (StagedWrites, cls), {})
    builder.stager, builder.owner_name = stager, owner_name
    return builder
