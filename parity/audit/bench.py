"""What the audit costs: replay time without it, with a shadow check every replay, and every 16th.

`measure_overhead()` captures the same workload three times (plain graph,
GraphAudit every=1, GraphAudit every=16) on the backend present (CUDA when
available, else the emulated stand-in) and times their replays side by side
in one loop (rotating order, inputs refreshed before each, the cyclic garbage
collector paused), so drift in machine load hits all three
alike; it returns medians. `python -m parity.audit.bench` prints them.
"""

from __future__ import annotations

import gc
import statistics
import time

import torch

from parity.audit import emulated
from parity.audit.adapters import audited_graph
from parity.audit.audit import GraphAudit
from parity.audit.capture import paused_gc


class DecodeStep:
    """A decoder-sized step: attention over a static KV cache (written at `positions`) and an MLP, layered."""

    def __init__(self, device, batch: int = 8, hidden: int = 256, layers: int = 2, max_seq: int = 128, seed: int = 0):
        gen = torch.Generator(device="cpu").manual_seed(seed)
        rand = lambda *shape: (torch.randn(*shape, generator=gen) * shape[-1] ** -0.5).to(device)  # noqa: E731
        self.weights = [(rand(3 * hidden, hidden), rand(hidden, hidden), rand(4 * hidden, hidden),
                         rand(hidden, 4 * hidden)) for _ in range(layers)]
        self.caches = [torch.zeros(batch, max_seq, 2, hidden, device=device) for _ in range(layers)]
        self.x = torch.zeros(batch, hidden, device=device)
        self.positions = torch.zeros(batch, dtype=torch.long, device=device)
        self.rows = torch.arange(batch, device=device)

    def __call__(self) -> torch.Tensor:
        x = self.x
        for (qkv, out, up, down), cache in zip(self.weights, self.caches):
            q, k, v = (x @ qkv.T).chunk(3, dim=-1)
            cache[self.rows, self.positions] = torch.stack((k, v), dim=1)
            keys, values = cache[:, :, 0], cache[:, :, 1]
            visible = torch.arange(cache.shape[1], device=x.device) <= self.positions[:, None]
            scores = torch.einsum("bh,bth->bt", q, keys).masked_fill(~visible, float("-inf"))
            x = x + torch.einsum("bt,bth->bh", scores.softmax(-1), values) @ out.T
            x = x + torch.relu(x @ up.T) @ down.T
        return x

    def refresh(self, step: int) -> None:
        self.x.copy_(torch.sin(torch.arange(self.x.numel(), device=self.x.device).view_as(self.x) * 0.01 + step))
        self.positions.fill_(step % self.caches[0].shape[1])


def _capture(step: DecodeStep, every: int | None):
    cuda = step.x.is_cuda
    graph = torch.cuda.CUDAGraph() if cuda else emulated.CUDAGraph()
    if cuda:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
    if every is None:
        with (torch.cuda.graph(graph) if cuda else emulated.graph(graph)):
            outputs = step()
    else:
        audit = GraphAudit(step, name=f"bench every={every}", every=every)
        with audited_graph(graph, audit) as run:
            outputs = run()
    return graph, outputs


def measure_overhead(iterations: int = 48, device: str | torch.device | None = None, make_step=DecodeStep) -> dict:
    """Median replay time (ms) of a plain graph, an audited one checked every replay and every 16th.

    Returns {"backend", "device", "iterations", "replay_ms": {"plain", "every_1", "every_16"},
    "overhead": {"every_1", "every_16"}} (overhead: audited / plain).
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    variants = {"plain": None, "every_1": 1, "every_16": 16}
    steps = {name: make_step(device) for name in variants}
    graphs = {name: _capture(steps[name], every) for name, every in variants.items()}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    gc.collect()
    # NOTE: no cyclic collection inside the loop (refcounting still frees): it would land in a timing.
    with torch.no_grad(), paused_gc():
        for i in range(iterations):
            # NOTE: the order rotates so no variant always runs after the allocation-heavy one.
            for name in names[i % 3:] + names[:i % 3]:
                steps[name].refresh(i)
                sync()
                start = time.perf_counter()
                graphs[name][0].replay()
                sync()
                times[name].append((time.perf_counter() - start) * 1e3)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {"backend": "cuda" if device.type == "cuda" else "emulated",
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "iterations": iterations, "replay_ms": {k: round(v, 4) for k, v in medians.items()},
            "overhead": {k: round(medians[k] / medians["plain"], 2) for k in ("every_1", "every_16")}}


def main() -> None:
    """Print measure_overhead() as a table (python -m parity.audit.bench)."""
    from rich.console import Console
    from rich.table import Table

    result = measure_overhead()
    table = Table(title=f"parity.audit overhead · {result['backend']} ({result['device']}), "
                        f"median of {result['iterations']}")
    for column in ("", "replay ms", "x plain"):
        table.add_column(column, justify="right")
    for name, ms in result["replay_ms"].items():
        table.add_row(name, f"{ms:.3f}", f"{result['overhead'].get(name, 1.0):.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
