"""A test seam that simulates padding numerics on machines whose kernels are batch-invariant.

On a GPU in bf16 the same maths at another padded shape rounds differently: a
graph replay and its strict padded reference agree bit for bit, both differ
slightly from plain eager, and a near tie flips a greedy token now and then.
CPU kernels here turned out batch-invariant (the embedded pair in bf16 gave
|Δ logprob| = 0), so nothing would exercise the NUMERICS path in CI.

`simulate_padding_numerics(parts, scale)` replaces the target runner and the
proposer with subclasses whose logits steps add `scale * noise(T)` whenever a
forward is padded (its real token count, `query_start_loc[-1]`, is below the
padded count T). The noise is a deterministic function of the padded shape
only, computed on the device inside the forward, so a graph replay and its
padded reference perturb identically and plain eager (never padded) not at
all. It is a seam for tests and demonstrations (`--simulate-padding-numerics`);
it changes no verdict logic.
"""

from __future__ import annotations

import torch

from parity.engine.parts import EngineParts

# The persistent buffer the seam itself reads inside every forward it perturbs (its entry past the last
# padded row: the real token count, to tell a padded forward from an unpadded one). It reads the owner's
# registry, never the metadata object, so a graph that missed the metadata (CAPTURE_CONTEXT) is not
# confused by the seam; but a fault that rebinds this registry buffer also reaches graphs whose own
# forwards never read it (a PIECEWISE graph's logits step, through the seam): there the run rightly drifts.
READS = ("query_start_loc",)


def padding_noise(logits: torch.Tensor, buffers, meta, num_tokens_padded: int) -> torch.Tensor:
    """scale-free noise in [-1, 1] of the logits' shape, nonzero only when the batch is padded."""
    rows, vocab = logits.shape
    index = torch.arange(rows * vocab, device=logits.device, dtype=torch.float32).view(rows, vocab)
    noise = torch.sin(index * 12.9898 + float(num_tokens_padded) * 78.233)
    num_reqs_padded = meta.query_start_loc.shape[0] - 1      # a shape: static per graph, nothing read
    padded = (buffers["query_start_loc"][num_reqs_padded] != num_tokens_padded).to(torch.float32)
    return noise * padded


class _PaddedTargetNumerics:
    numerics_scale = 0.0

    def logits(self, hidden, meta):
        logits = super().logits(hidden, meta)
        return logits + self.numerics_scale * padding_noise(logits, self.buffers, meta, hidden.shape[0])


class _PaddedDraftNumerics:
    numerics_scale = 0.0

    def draft_logits(self, row_hidden, meta):
        logits = super().draft_logits(row_hidden, meta)
        return logits + self.numerics_scale * padding_noise(logits, self.buffers, meta, _padded_tokens(meta))


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
    return parts.replace(target_runner=target, proposer=proposer)
