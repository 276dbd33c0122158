"""A vLLM-V1-shaped engine in miniature, for parity.audit: forward context, metadata builder, FULL and PIECEWISE.

Pure torch, tiny random weights; graphs through torch.cuda on a GPU and
parity.audit.emulated on the CPU. `ModelRunner(mode, bugs=...)` plants the
faults of `BUGS`; `audit_glue.py` is all a user writes to audit it.
"""

from examples.vllm_shaped.forward_context import BatchDescriptor, CUDAGraphMode, get_forward_context
from examples.vllm_shaped.runner import BUGS, ModelRunner

__all__ = ["BUGS", "BatchDescriptor", "CUDAGraphMode", "ModelRunner", "get_forward_context"]
