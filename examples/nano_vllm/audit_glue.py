"""The glue a user writes to audit nano-vllm (counted by tests/test_audit_nano_vllm.py: at most 10 lines)."""

from nanovllm.utils.context import get_context
from parity.audit import auto_audit


def audited(runners: list, every: int = 1):
    """Audit every graph nano-vllm captures: its global attention context and its graph_vars declared."""
    static = {"context": get_context, "graph_vars": lambda: runners[0].graph_vars if runners else None}
    return auto_audit(every=every, configure=lambda fn, args: {"static_inputs": static})
