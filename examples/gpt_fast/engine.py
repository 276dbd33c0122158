"""Engine: greedy decoding of a batch of requests with CUDA graphs by hand, gpt-fast style, plus a draft model.

Each step: the target's decode graph for the padded batch size (1, 2 or 4)
gives the next tokens; the draft's graph (captured once at batch 4) proposes
a token for the same rows and writes it into `history[:, step]`; acceptance
counts how often the draft agreed. Per-step inputs are built fresh in a
`Batch` the callables read through `self.batch`; graph mode copies them into
the persistent `self.static` buffers the graphs were captured on. Graph
outputs are held weakly, as vLLM holds them. `graphs=False` runs every step
eagerly: the reference the graphs must equal.

Planted bugs (`Engine(bugs={...})`), each a one-line mistake:
    rebound        the target's token buffer is rebound to a fresh tensor instead of copied into
    stale          the draft's positions are not copied into their buffer before replay
    frozen         the draft writes its token at column `self.step`, a Python int baked at capture
    padding        padded rows point at cache row 0 (a live request's) instead of the trash row
    pool_overwrite the draft graph is captured into the target's pool: its temporaries overwrite the logits
    kv_realloc     the target's KV cache is reallocated after capture instead of zeroed in place
    output_alias   the first step's logits are kept by reference and read after later replays
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from examples.gpt_fast.model import PAD_ID, Decoder
from parity.audit import emulated

BUGS = ("rebound", "stale", "frozen", "padding", "pool_overwrite", "kv_realloc", "output_alias")


@dataclass
class Batch:
    tokens: torch.Tensor      # [bs] the last token of each request
    positions: torch.Tensor   # [bs] its position
    rows: torch.Tensor        # [bs] cache row per request; padded rows: the trash row
    step: torch.Tensor        # [1] the history column the draft writes


class Engine:
    def __init__(self, device="cpu", sizes=(1, 2, 4), graphs: bool = True, bugs=()):
        if set(bugs) - set(BUGS):
            raise ValueError(f"unknown bugs {sorted(set(bugs) - set(BUGS))}; known: {BUGS}")
        self.device, self.sizes, self.bugs = torch.device(device), sorted(sizes), frozenset(bugs)
        self.max_batch = self.trash = self.sizes[-1]
        self.target = Decoder(layers=2, rows=self.max_batch + 1, seed=0, device=device)
        self.draft = Decoder(layers=1, rows=self.max_batch + 1, seed=1, device=device)
        z = lambda *shape: torch.zeros(shape, dtype=torch.long, device=device)  # noqa: E731
        self.static = Batch(z(self.max_batch), z(self.max_batch), z(self.max_batch) + self.trash, z(1))
        self.history = z(self.max_batch, 64)
        self.batch, self.step, self.num_valid = self.static, 0, 0
        self.accepted = self.proposed = 0
        self.decode: dict[int, tuple] = {}
        self.draft_graph = None
        if graphs:
            self._capture()
        if "kv_realloc" in self.bugs:            # BUG kv_realloc: a new cache, not the captured one zeroed
            self.target.layers[0].cache.k = torch.zeros_like(self.target.layers[0].cache.k)

    def decode_step(self, bs: int) -> torch.Tensor:
        """Captured body: the target's logits [bs, vocab] for `self.batch`."""
        b = self.batch
        return self.target(b.tokens[:bs], b.positions[:bs], b.rows[:bs])

    def draft_step(self, bs: int) -> torch.Tensor:
        """Captured body: the draft's token [bs] for `self.batch`, also written into history[:, step]."""
        b = self.batch
        token = self.draft(b.tokens[:bs], b.positions[:bs], b.rows[:bs]).argmax(-1)
        if "frozen" in self.bugs:                # BUG frozen: a Python int, baked in at capture
            self.history[:bs, self.step] = token
        else:
            self.history[:bs].scatter_(1, b.step.view(1, 1).expand(bs, 1), token[:, None])
        return token

    # --- graphs ---------------------------------------------------------------------------

    def _capture(self) -> None:
        G = torch.cuda if self.device.type == "cuda" else emulated
        pool = G.graph_pool_handle()
        draft_pool = pool if "pool_overwrite" in self.bugs else G.graph_pool_handle()   # BUG pool_overwrite
        for bs in reversed(self.sizes):           # largest first: smaller graphs reuse its memory
            self.decode[bs] = self._graph(G, pool, self.decode_step, bs)
        self.draft_graph = self._graph(G, draft_pool, self.draft_step, self.max_batch)

    def _graph(self, G, pool, fn, bs: int) -> tuple:
        if G is torch.cuda:                       # warm up on a side stream, as torch.cuda.graph wants
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fn(bs)
            torch.cuda.current_stream().wait_stream(stream)
        graph = G.CUDAGraph()
        with G.graph(graph, pool=pool):
            out = fn(bs)
        return graph, G.weak_ref_tensors(out) if G is emulated else _non_owning(out)

    # --- one step ---------------------------------------------------------------------------

    def _run(self, fn, graph_entry, batch: Batch, bs: int, refresh_positions: bool = True):
        self.batch = batch
        if graph_entry is None:
            return fn(bs)
        s = self.static
        if "rebound" in self.bugs and fn == self.decode_step:    # BUG rebound: a new tensor, not a copy
            s.tokens = torch.cat((batch.tokens[:bs], s.tokens[bs:]))
        else:
            s.tokens[:bs].copy_(batch.tokens[:bs])
        if refresh_positions:
            s.positions[:bs].copy_(batch.positions[:bs])
        s.rows[:bs].copy_(batch.rows[:bs])
        s.step.copy_(batch.step)
        graph, out = graph_entry
        graph.replay()
        return out

    def _batch(self, reqs: list[list[int]], bs: int) -> Batch:
        n = len(reqs)
        pad_row = 0 if "padding" in self.bugs else self.trash                 # BUG padding
        tokens = torch.full((bs,), PAD_ID, dtype=torch.long, device=self.device)
        positions = torch.zeros(bs, dtype=torch.long, device=self.device)
        rows = torch.full((bs,), pad_row, dtype=torch.long, device=self.device)
        tokens[:n] = torch.tensor([r[-1] for r in reqs])
        positions[:n] = torch.tensor([len(r) - 1 for r in reqs])
        rows[:n] = torch.tensor([r.row for r in reqs])
        return Batch(tokens, positions, rows, torch.tensor([self.step], device=self.device))

    @torch.no_grad()
    def generate(self, prompts: list[int], max_new: list[int]) -> tuple[list[list[int]], list[torch.Tensor]]:
        """Greedy continuation of one-token prompts; (tokens per request, the logits of every step)."""
        reqs = [_Request([p], i, m) for i, (p, m) in enumerate(zip(prompts, max_new))]
        active, steps, kept = reqs, [], None
        while active:
            n = len(active)
            bs = next(s for s in self.sizes if s >= n)
            self.num_valid = n
            logits = self._run(self.decode_step, self.decode.get(bs), self._batch(active, bs), bs)
            self._run(self.draft_step, self.draft_graph, self._batch(active, self.max_batch),
                              self.max_batch, refresh_positions="stale" not in self.bugs)
            if "output_alias" in self.bugs and kept is None and self.decode:
                kept = logits                    # BUG output_alias: kept by reference past the next replay
            real = (kept if kept is not None else logits)[:n].clone()
            steps.append(real)
            nxt = real.argmax(-1).tolist()
            self.proposed += n
            self.accepted += sum(int(d == t) for d, t in zip(self.history[:n, self.step].tolist(), nxt))
            for r, t in zip(active, nxt):
                r.append(t)
            self.step += 1
            active = [r for r in active if len(r) < r.max_new + 1]
        return [list(r) for r in reqs], steps


class _Request(list):
    def __init__(self, tokens, row: int, max_new: int):
        super().__init__(tokens)
        self.row, self.max_new = row, max_new


class _NonOwning:
    def __init__(self, t: torch.Tensor):
        self.__cuda_array_interface__ = {"shape": (t.numel() * t.element_size(),), "typestr": "|u1",
                                         "data": (t.data_ptr(), False), "version": 2, "strides": None}


def _non_owning(t: torch.Tensor) -> torch.Tensor:
    """A CUDA graph output held without its memory (vLLM's weak_ref_tensors): the pool may hand it out again."""
    return torch.as_tensor(_NonOwning(t), device=t.device).view(t.dtype).view(t.shape)
