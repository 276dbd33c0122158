"""A second engine, written in another style than parity/engine: gpt-fast-like greedy EAGLE-1 decoding.

Static KV cache tensors indexed by (cache row, position), a target verify step
and an EAGLE draft step each graphed by hand with `torch.cuda.graph` (or the
emulated stand-in on the CPU) at a few padded batch sizes, per-step inputs
built fresh and copied into persistent buffers the graphs read (nano-vllm's
way). It shares no code with parity/engine or parity/models: it loads the
embedded tiny pair's safetensors itself and does its own Llama maths.

Planted bugs (`SpecEngine(bugs={...})`), each a one-line mistake:
    stale        the draft step's positions are not copied into their buffer before replay
    reassigned   the draft step's cache rows buffer is rebound to a fresh tensor instead of copied into
    frozen       the draft step writes its token into column `self.draft_step`, a Python int baked at capture
    padding      the draft log-softmax is stabilised by the max over the whole padded batch
    pool_alias   the draft graphs are captured into the target's pool (outputs held weakly, as vLLM does)
"""

from tests.second_engine.engine import BUGS, SpecEngine
from tests.second_engine.weights import load_pair

__all__ = ["BUGS", "SpecEngine", "load_pair"]
