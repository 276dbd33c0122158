"""The memory plan: what every mode's run will hold, from config files and the scenario, before any allocation.

Runs happen one after another and give everything back (`release.py`), so a
mode needs the weights (loaded once) plus what its own run holds:

- **KV cache**: target layers + the head's layer, (max_num_seqs x blocks_per_seq
  x block_size + 1 trash row) slots each, exactly as `engine/kv_cache.py`
  allocates it;
- **buffers**: the persistent input buffers of both owners, exactly as
  registered (when sampling, the drafter's [max_num_seqs, K, vocab] fp32 distributions dominate);
- **graphs**: per owner, the pool of its captures: the largest moment of its
  largest captured forward (`activations.py`; graphs of one owner share a
  pool, the drafter's is separate unless shared), plus what PIECEWISE graphs
  keep alive (each piece's q/k/v and attention output);
- **activations**: the largest forward that runs outside graphs (eager mode,
  a batch no graph covers, PIECEWISE's eager attention) and the verify output's
  log-softmax the records take, [max_num_batched_tokens, vocab] in fp32;
- **capture state**: while graphs are captured, one copy of the KV cache and
  buffers (a capture leaves no trace: they are put back after each one). It
  is alive only before the run starts, so a mode needs the larger of it and
  the activations, not both;
- **slack**: 256 MiB + 5% of the run for the caching allocator's rounding.

A graph mode's padded reference runs eagerly at the mode's padded shapes:
eager's run, plus its padding probe (`engine/padding_probe.py`), which saves
a probed forward's pre-state (the buffers, the KV rows its slots name) and
compares two runs' live outputs (logits, features, written KV rows): at 8B
with 2048-token chunks, ~2.8 GiB beyond eager (**padded ref** in the table).

The budget is the device's free memory (`torch.cuda.mem_get_info`), available
RAM on the CPU, or `--device-memory GIB`. Over budget is one line (exit 2)
naming the figures and the knob to lower, before any weight is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from parity.engine.config import EngineConfig, candidate_columns
from parity.errors import OutOfDeviceMemory
from parity.graphs.dispatcher import Dispatcher
from parity.graphs.modes import EAGER, FULL, PIECEWISE, default_capture_sizes, fallback_for, validate_capture_sizes
from parity.harness.activations import (FP32, Dims, Geometry, attention_bytes, draft_bytes, pieces_bytes,
                                        verify_bytes)
from parity.models import memory

GIB = 1 << 30
SLACK_BYTES = 256 << 20
SLACK_SHARE = 0.05
COMPONENTS = ("kv_cache", "buffers", "graphs_target", "graphs_drafter", "pieces", "activations", "capture_state",
              "slack")


@dataclass
class ModePlan:
    mode: str
    kv_cache: int = 0
    buffers: int = 0
    graphs_target: int = 0       # the target's graph pool
    graphs_drafter: int = 0      # the drafter's pool (0 when it shares the target's)
    pieces: int = 0              # q/k/v and attention outputs PIECEWISE graphs keep
    activations: int = 0         # forwards outside graphs, and the records' log-softmax
    capture_state: int = 0       # the copy of KV cache and buffers alive while graphs are captured
    slack: int = 0
    graphs: int = 0              # how many graphs the run captures
    probe: int = 0               # its padded reference's padding probe: a pre-state and two live-output copies

    @property
    def run_bytes(self) -> int:
        """The run's largest moment: capture (its state copy) or the run (its activations), never both."""
        held = self.kv_cache + self.buffers + self.graphs_target + self.graphs_drafter + self.pieces
        return held + max(self.activations, self.capture_state) + self.slack

    @property
    def graph_bytes(self) -> int:
        return self.graphs_target + self.graphs_drafter + self.pieces


@dataclass
class MemoryPlan:
    model: str
    dtype: str
    weights: int
    modes: dict[str, ModePlan]
    knobs: dict                           # the scenario's figures a user can lower
    eager_run: int = 0                    # eager's run bytes: what a padded reference holds besides its probe
    budget: int | None = None
    budget_source: str = ""
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)

    def total(self, mode: str) -> int:
        return self.weights + self.modes[mode].run_bytes

    def reference_run(self, mode: str) -> int:
        """What `mode`'s padded reference holds beyond the weights (eager holds no reference: 0)."""
        return 0 if mode == EAGER else self.eager_run + self.modes[mode].probe

    def need(self, mode: str) -> int:
        """The most the device holds for `mode`: its run, or its padded reference's."""
        return max(self.total(mode), self.weights + self.reference_run(mode))

    @property
    def worst(self) -> str:
        return max(self.modes, key=self.need)

    @property
    def fits(self) -> bool:
        return self.budget is None or all(self.need(m) <= self.budget for m in self.modes)

    def message(self) -> str:
        """One line: the mode that does not fit, its figures in GiB, the budget and the knob to lower."""
        worst = self.modes[self.worst]
        if self.need(worst.mode) > self.total(worst.mode):
            run, need = f"padded reference of {worst.mode}", self.need(worst.mode)
            figures = (("weights", self.weights), ("eager's run", self.eager_run), ("padding probe", worst.probe))
        else:
            run, need = f"{worst.mode} run", self.total(worst.mode)
            figures = (("weights", self.weights), ("KV cache", worst.kv_cache), ("buffers", worst.buffers),
                       ("graphs", worst.graph_bytes), ("activations", worst.activations),
                       ("capture copy", worst.capture_state), ("slack", worst.slack))
        parts = ", ".join(f"{label} {_gib(value)}" for label, value in figures)
        return (f"memory plan: the {run} of {self.model} in {self.dtype} needs {need / GIB:.1f} GiB ({parts}) but "
                f"{self.budget_source} is {(self.budget or 0) / GIB:.1f} GiB; {self.knob()} (`parity run --plan` "
                f"shows every mode)")

    def knob(self) -> str:
        """What to lower, from the component that dominates the worst run."""
        worst, k = self.modes[self.worst], self.knobs
        if self.weights + SLACK_BYTES > (self.budget or 0):
            return "the weights alone do not fit: use a smaller --dtype or a larger device"
        biggest = max(("graphs", worst.graph_bytes), ("activations", worst.activations + worst.probe),
                      ("kv", worst.kv_cache + worst.capture_state), key=lambda item: item[1])[0]
        if biggest == "kv":
            hint = f"lower max_model_len ({k['max_model_len']}) or max_num_seqs ({k['max_num_seqs']})"
        elif biggest == "graphs":
            hint = (f"lower max_num_batched_tokens ({k['max_num_batched_tokens']}) or capture_sizes (largest "
                    f"{k['largest_capture_size']})")
        else:
            hint = f"lower max_num_batched_tokens ({k['max_num_batched_tokens']})"
        fitting = [m for m in self.modes if self.budget is not None and self.need(m) <= self.budget]
        if fitting:
            over = [m for m in self.modes if m not in fitting]
            hint += f", or leave out --modes {','.join(over)}"
        return hint + f" in {k['scenario']}"

    def as_dict(self) -> dict:
        return {"model": self.model, "dtype": self.dtype, "device": self.device, "weights_bytes": self.weights,
                "budget_bytes": self.budget, "budget_source": self.budget_source, "fits": self.fits,
                "knobs": self.knobs, "notes": self.notes,
                "modes": {m: {**{f"{c}_bytes": getattr(p, c) for c in COMPONENTS}, "graphs": p.graphs,
                              "total_bytes": self.total(m), "probe_bytes": p.probe,
                              "reference_total_bytes": self.weights + self.reference_run(m) if m != EAGER else None}
                          for m, p in self.modes.items()}}


def make_plan(target: dict, head: dict, dtype: torch.dtype, scenario, modes, model: str = "",
              policy_shared_pool: bool = False) -> MemoryPlan:
    """The plan of `modes` for a pair given by its config.json dicts (no budget yet)."""
    s = dtype.itemsize
    cfg = EngineConfig.of(scenario)
    sizes = validate_capture_sizes(scenario.capture_sizes) if scenario.capture_sizes is not None \
        else default_capture_sizes(cfg.max_num_batched_tokens)
    shapes = _Shapes(target, head, s, cfg)
    shared = policy_shared_pool or scenario.shared_drafter_pool
    plans = {mode: _mode_plan(mode, shapes, cfg, sizes, scenario.drafter_mode, shared) for mode in modes}
    eager = plans[EAGER] if EAGER in plans else _mode_plan(EAGER, shapes, cfg, sizes, scenario.drafter_mode, shared)
    knobs = {"scenario": scenario.path, "max_num_batched_tokens": cfg.max_num_batched_tokens,
             "max_model_len": cfg.max_model_len, "max_num_seqs": cfg.max_num_seqs,
             "largest_capture_size": max((s_ for s_ in sizes if s_ <= cfg.max_num_batched_tokens), default=0)}
    weights = (memory.target_params(target) + memory.head_params(head)) * s
    return MemoryPlan(model, str(dtype).removeprefix("torch."), weights, plans, knobs, eager_run=eager.run_bytes,
                      notes=["a padded reference runs eagerly at its mode's padded shapes: eager's run plus its "
                             "padding probe's copies (padded ref)"])


class _Shapes:
    """The pair's dims and the engine's exact KV cache and buffer bytes for one engine config."""

    def __init__(self, target: dict, head: dict, itemsize: int, cfg):
        self.eagle3 = "draft_vocab_size" in head or "Eagle3" in " ".join(map(str, head.get("architectures") or []))
        self.t = Dims.of(target)
        # NOTE: an EAGLE-3 head's logits come out in the target vocabulary (its draft ids scattered
        # through d2t), so its sampling and the drafter's buffers are target-vocabulary wide too.
        self.h = Dims.of(head, layers=head.get("num_hidden_layers", 1), vocab=target["vocab_size"])
        self.s = itemsize
        self.geometry = Geometry(cfg.block_size, cfg.max_model_len, cfg.blocks_per_seq)
        self.aux = 3 * self.t.hidden if self.eagle3 else 0
        slots = cfg.num_blocks * cfg.block_size + 1
        self.kv_cache = sum(2 * d.layers * slots * d.kv_heads * d.head_dim * itemsize for d in (self.t, self.h))
        T, R, K = cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.num_speculative_tokens
        Td = max(T, R * cfg.topk)     # a tree's draft step forwards topk nodes per request

        def attention(tokens: int) -> int:   # register_attention_buffers
            return 8 * (4 * tokens + (R + 1) + R + R * cfg.blocks_per_seq + R)
        sampled = R * K * self.h.vocab * FP32 if cfg.temperature > 0 else 0     # draft_probs: only when sampling
        drafter = Td * self.h.hidden * itemsize + 8 * R + 8 + R * K * (8 + 4 + 4) + sampled
        self.buffers = attention(T) + attention(Td) + drafter + (self._tree(cfg, T, Td, itemsize) if cfg.tree else 0)

    def _tree(self, cfg, tokens: int, drafter_tokens: int, itemsize: int) -> int:
        """Tree drafts' buffers: the tree mask of both owners, the drafter's candidates and frontier."""
        rows, k = cfg.max_num_seqs, cfg.topk
        candidates = candidate_columns(cfg.num_speculative_tokens, k)
        return (3 * 8 * (tokens + drafter_tokens) + rows * (candidates + k) * (8 + 4 + 8)
                + rows * self.h.hidden * itemsize)

    def forward(self, owner: str, tokens: int, rows: int, attention: bool) -> int:
        if owner == "target":
            return verify_bytes(self.t, tokens, rows, self.s, self.geometry, attention, self.aux)
        return draft_bytes(self.h, tokens, rows, self.s, self.geometry, attention)

    def dims(self, owner: str) -> Dims:
        return self.t if owner == "target" else self.h

    def probe(self, tokens: int) -> int:
        """The padding probe of a padded reference around the target's verify of `tokens` padded tokens (its
        largest probed forward): the saved pre-state (every buffer, the KV rows the slots name) and two runs'
        live outputs (logits [T, vocab] fp32, the drafter's features, the KV rows written)."""
        t = self.t
        kv_row = 2 * t.layers * t.kv_heads * t.head_dim * self.s
        outputs = tokens * (t.vocab * FP32 + (self.aux or t.hidden) * self.s + kv_row)
        return self.buffers + tokens * kv_row + 2 * outputs


def _phases(cfg) -> dict[str, list[tuple[str, int, int]]]:
    """Each owner's forwards as (phase, largest batch in tokens, uniform query length), as the owners declare."""
    q = cfg.num_speculative_tokens + 1
    return {"target": [("verify", cfg.max_num_batched_tokens, q)],
            "drafter": [("draft_prefill", cfg.max_num_batched_tokens, q), ("draft_step", cfg.max_num_seqs, 1)]}


def _mode_plan(mode: str, shapes: _Shapes, cfg, sizes, drafter_mode, shared_pool: bool) -> ModePlan:
    plan = ModePlan(mode, kv_cache=shapes.kv_cache, buffers=shapes.buffers)
    T, R = cfg.max_num_batched_tokens, cfg.max_num_seqs
    peaks, eager, piecewise_tokens, padded_verify = {}, [], 0, 0
    for owner, phases in _phases(cfg).items():
        owner_mode = mode if owner == "target" else drafter_mode or mode
        dispatcher = Dispatcher(owner_mode, sizes, R, T, {p: q for p, _, q in phases})
        peaks[owner] = 0
        for phase, max_tokens, _ in phases:
            for runtime, _, tokens, rows in dispatcher.capture_plan(phase, max_tokens):
                plan.graphs += 1
                if owner == "target":
                    padded_verify = max(padded_verify, tokens)
                peaks[owner] = max(peaks[owner], shapes.forward(owner, tokens, rows, attention=runtime == FULL))
                if runtime == PIECEWISE:
                    plan.pieces += pieces_bytes(shapes.dims(owner), tokens, shapes.s)
                    piecewise_tokens = max(piecewise_tokens, tokens)
        # A batch runs eagerly when the mode says so, or when it outgrows every token-keyed graph.
        if fallback_for(owner_mode) == EAGER or not dispatcher.token_sizes or max(dispatcher.token_sizes) < T:
            eager.append(shapes.forward(owner, T, min(R, T), attention=True))
    if shared_pool:
        plan.graphs_target = max(peaks.values())
    else:
        plan.graphs_target, plan.graphs_drafter = peaks["target"], peaks["drafter"]
    if piecewise_tokens:
        eager.append(attention_bytes(shapes.t, piecewise_tokens, min(R, piecewise_tokens), shapes.s,
                                     shapes.geometry))
    target_eager = fallback_for(mode) == EAGER or max((s for s in sizes if s <= T), default=0) < T
    records = T * shapes.t.vocab * FP32 * (2 if target_eager else 1)   # logits (when eager) + their log-softmax
    plan.activations = max(eager + [records])
    plan.capture_state = plan.kv_cache + plan.buffers if plan.graphs else 0
    plan.slack = SLACK_BYTES + int(SLACK_SHARE * plan.run_bytes)
    plan.probe = shapes.probe(padded_verify) if padded_verify else 0
    return plan


def check_plan(plan: MemoryPlan | None) -> None:
    """Refuse, in one line, a plan that does not fit its budget."""
    if plan is not None and not plan.fits:
        raise OutOfDeviceMemory(plan.message())


def _gib(value: float) -> str:
    """GiB with one decimal, two below 1 GiB (a 0.05 GiB cache is not 0.0)."""
    return f"{value / GIB:.{1 if value >= GIB else 2}f}"
