"""nano-vllm's own ModelRunner, unmodified, on a tiny random Qwen3 (examples/nano_vllm/upstream), on CPU or GPU.

    from examples.nano_vllm import generate
    tokens, logits = generate(bugs=())          # greedy-equivalent decode of three requests, padded batches

`upstream/` is the source (UPSTREAM.md), `kernels.py` the pure-torch stand-ins
for flash-attn and Triton, `platform.py` the CPU's stand-ins for CUDA and the
process group, `harness.py` the tiny model and the decode loop (nano-vllm's
scheduler and block manager are not vendored: three requests get one KV block
each), `bugs.py` the planted bugs, `audit_glue.py` the lines a user writes.
"""

import sys

from examples.nano_vllm.harness import UPSTREAM, generate, runner_class

if str(UPSTREAM) not in sys.path:         # nano-vllm as if installed (its `nanovllm` package)
    sys.path.insert(0, str(UPSTREAM))

__all__ = ["generate", "runner_class"]
