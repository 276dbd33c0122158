"""The glue a user writes to audit this engine (counted by tests/test_vllm_shaped_audit.py: at most 10 lines)."""

from examples.vllm_shaped.forward_context import get_forward_context
from parity.audit import KeyedAudit


def audit(runner, **options):
    for wrapper in runner.wrappers():      # vLLM: the FULL wrapper, or each piece's (submod_i) PIECEWISE wrapper
        wrapper.runnable = KeyedAudit(
            wrapper.runnable, key=lambda: get_forward_context().batch_descriptor,
            active=lambda mode=wrapper.runtime_mode: get_forward_context().cudagraph_runtime_mode == mode,
            name=lambda key, r=wrapper.runnable: f"{r.name}[num_tokens={key.num_tokens}]",
            static_inputs={"forward_context": get_forward_context, "buffers": runner.buffers},
            num_valid=lambda: runner.num_reqs, **options)
