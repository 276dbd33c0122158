"""The red team's runs of examples/vllm_shaped (tests/test_redteam_*.py): one workload, the reference run, the
audited run of a mistaken runner."""

from __future__ import annotations

import random

import torch

from examples.vllm_shaped import CUDAGraphMode, ModelRunner, audit_glue
from parity.audit import auto_audit


def workload():
    rnd = random.Random(0)
    return [[rnd.randrange(64) for _ in range(rnd.randint(3, 8))] for _ in range(3)], [9, 6, 3]


def audited(runner_class, mode, reference_class=ModelRunner, read=None):
    """(the reference's (tokens, logits) run eagerly, the audit session, what the audited run of `runner_class` in
    `mode` gave: its (tokens, logits), or `read` of them, called inside the audit)."""
    prompts, max_new = workload()
    reference = reference_class(CUDAGraphMode.NONE).capture().generate(prompts, max_new)
    with auto_audit() as session:
        runner = runner_class(mode)
        audit_glue.audit(runner, every=1, on_mismatch="record")
        graphed = runner.capture().generate(prompts, max_new)
        if read is not None:
            graphed = read(graphed)
    return reference, session, graphed


def parts(reference, graphed) -> bool:
    """The run's logits are not the reference's, bit for bit."""
    return not all(torch.equal(a, b) for a, b in zip(reference[1], graphed[1]))
