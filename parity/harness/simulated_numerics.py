"""A test seam that simulates padding numerics on machines whose kernels are batch-invariant.

On a GPU in bf16 the same maths at another padded shape rounds differently: a
graph replay and its strict padded reference agree bit for bit, both differ
slightly from plain eager, and a near tie flips a greedy token now and then.
CPU kernels here turned out batch-invariant (the embedded pair in bf16 gave
|Δ logprob| = 0), so nothing would exercise the NUMERICS path in CI.

`simulate_padding_numerics(parts, scale)` replaces the target runner and the
proposer with subclasses whose logits steps add `scale * noise(T)` whenever a
forward is padded (its real token count is below the padded count T), and both
metadata builders with subclasses that write that fact, before each forward,
into a flag tensor of the seam's own: outside the owner's registry, so the
seam reads no padded entry (the padding probe moves those, and would rightly
name a read of one). In the overlapped loop the flag is staged like every other
host-built input (a pinned slot, the copy stream, the forward waits its copy):
written straight to the device, the next batch's build would overwrite it
before the forward that reads it ran. The noise is a deterministic function of the padded shape
only, computed on the device inside the forward, so a graph replay and its
padded reference perturb identically and plain eager (never padded) not at
all. It is a seam for tests and demonstrations (`--simulate-padding-numerics`);
it changes no verdict logic.
"""

from __future__ import annotations

import torch

from parity.engine.parts import EngineParts


def padding_noise(logits: torch.Tensor, padded: torch.Tensor, num_tokens_padded: int) -> torch.Tensor:
    """Scale-free noise in [-1, 1] of the logits' shape, nonzero only when the `padded` flag is set."""
    rows, vocab = logits.shape
    index = torch.arange(rows * vocab, device=logits.device, dtype=torch.float32).view(rows, vocab)
    return torch.sin(index * 12.9898 + float(num_tokens_padded) * 78.233) * padded


class _PaddedFlag:
    """A metadata builder that also writes whether its batch is padded into `seam_padded`, before the forward."""

    def __init__(self, buffers, *args, **kwargs):
        super().__init__(buffers, *args, **kwargs)
        self.seam_padded = torch.zeros((), dtype=torch.float32, device=buffers.device)

    def build(self, rows, num_tokens_padded, num_reqs_padded, *args, **kwargs):
        meta = super().build(rows, num_tokens_padded, num_reqs_padded, *args, **kwargs)
        flag = float(sum(r.query_len for r in rows) < num_tokens_padded)
        stager = getattr(self, "stager", None)
        if stager is not None and stager.active:    # the overlapped loop: staged like every host-built input
            stager.stage(f"{self.owner_name}.seam_padded", self.seam_padded, torch.tensor([flag]))
        else:
            self.seam_padded.fill_(flag)
        return meta


class _PaddedTargetNumerics:
    numerics_scale = 0.0

    def logits(self, hidden):
        logits = super().logits(hidden)
        return logits + self.numerics_scale * padding_noise(logits, self.builder.seam_padded, hidden.shape[0])


class _PaddedDraftNumerics:
    """The draft logits move by the noise of the draft forward's padded shape (the forward's own argument,
    kept on the proposer for the forward only: `own_logits` takes just the rows)."""

    numerics_scale = 0.0

    def prefill_forward(self, num_tokens_padded, num_reqs_padded, meta):
        return self._padded_forward(super().prefill_forward, num_tokens_padded, num_reqs_padded, meta)

    def step_forward(self, num_tokens_padded, num_reqs_padded, meta):
        return self._padded_forward(super().step_forward, num_tokens_padded, num_reqs_padded, meta)

    def _padded_forward(self, forward, num_tokens_padded, num_reqs_padded, meta):
        self.seam_padded_tokens = _padded_tokens(meta)
        try:
            return forward(num_tokens_padded, num_reqs_padded, meta)
        finally:
            del self.seam_padded_tokens

    def own_logits(self, row_hidden):
        logits = super().own_logits(row_hidden)
        return logits + self.numerics_scale * padding_noise(logits, self.builder.seam_padded, self.seam_padded_tokens)


def _padded_tokens(meta) -> int:
    """The padded token count of the forward `meta` describes (a Python int: static per graph)."""
    return meta.slot_mapping.shape[0]


def simulate_padding_numerics(parts: EngineParts, scale: float) -> EngineParts:
    """`parts` whose target and drafter logits move by `scale * noise(padded shape)` in padded forwards."""
    if not scale:
        return parts
    target = type(f"Simulated{parts.target_runner.__name__}", (_PaddedTargetNumerics, parts.target_runner),
                  {"numerics_scale": float(scale)})
    proposer = type(f"Simulated{parts.proposer.__name__}", (_PaddedDraftNumerics, parts.proposer),
                    {"numerics_scale": float(scale)})
    builders = {name: type(f"Flagged{getattr(parts, name).__name__}", (_PaddedFlag, getattr(parts, name)), {})
                for name in ("target_builder", "drafter_builder")}
    return parts.replace(target_runner=target, proposer=proposer, padding_numerics=float(scale), **builders)
