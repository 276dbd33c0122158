"""What every run of a session shares, and the torch switches a run's bits depend on.

A worker process (`workers.py`) receives a `RunContext` once and applies its
`settings` before its first run, so each run there chooses the kernels, and
rounds, as it would in the parent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class NotSendable(Exception):
    """The run context could not go to a worker process (the message says what): run in this process instead."""


@dataclass
class RunContext:
    """What every run of a session shares, sent to each worker once."""

    pair: object
    scenario: object
    backend: str
    device: torch.device
    parts: object
    policy: object
    settings: dict


def torch_settings() -> dict:
    """The process-wide torch switches a kernel's choice and rounding depend on."""
    return {"threads": torch.get_num_threads(),
            "matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_tf32": torch.backends.cudnn.allow_tf32,
            "bf16_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
            "fp16_reduction": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
            "deterministic": torch.are_deterministic_algorithms_enabled()}


def apply_settings(settings: dict) -> None:
    if torch.get_num_threads() != settings["threads"]:
        torch.set_num_threads(settings["threads"])
    torch.set_float32_matmul_precision(settings["matmul_precision"])
    torch.backends.cuda.matmul.allow_tf32 = settings["cuda_tf32"]
    torch.backends.cudnn.allow_tf32 = settings["cudnn_tf32"]
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = settings["bf16_reduction"]
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = settings["fp16_reduction"]
    torch.use_deterministic_algorithms(settings["deterministic"])
