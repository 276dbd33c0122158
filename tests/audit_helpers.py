"""Shared by the parity.audit tests (CPU and GPU): the second engine's workload and the expected diagnoses.

The tests never tell the audit where to look: the engine is built and run
inside `auto_audit`, which finds each captured callable on its own; the only
configuration is what a user would declare once per engine (the real rows of
a padded batch, the persistent buffers, names for the outputs).
"""

from __future__ import annotations

import random

from parity.audit.auto import auto_audit
from tests.second_engine import SpecEngine
from tests.second_engine.engine import get_forward_context

# (kind, a word of the tensor role, the graph it must be found in: named where the engine keeps it,
# SpecEngine.graphs[('draft', 4)]) per planted bug. A capture context is
# reachable from nothing the audit can walk (a forward-context getter): its role is unnamed, None here.
EXPECTED = {
    "stale": ("STALE_BUFFER", "positions", "('draft'"),
    "reassigned": ("BUFFER_REASSIGNED", "rows", "('draft'"),
    "frozen": ("FROZEN_AT_CAPTURE", "draft_step", "('draft'"),
    "padding": ("PADDING_LEAK", "hidden", "('draft'"),
    "pool_alias": ("POOL_ALIAS", "logits", "('verify'"),
    "capture_context": ("CAPTURE_CONTEXT", None, "('verify'"),
}
OUTPUT_NAMES = {"verify_forward": ("logits", "hidden"), "draft_forward": ("token", "draft_hidden", "logprobs")}


def workload(seed: int = 0, vocab: int = 494) -> tuple[list[list[int]], list[int]]:
    """Three prompts whose requests finish at different steps: batches of 3, 2 and 1 (padded to 4, 2, 1)."""
    rnd = random.Random(seed)
    prompts = [[rnd.randrange(3, vocab) for _ in range(rnd.randint(4, 10))] for _ in range(3)]
    return prompts, [14, 8, 4]


def configure(fn, args) -> dict:
    """What an engine developer declares once: real rows, persistent buffers, output names."""
    engine = fn.__self__
    return {"num_valid": lambda: engine.num_valid, "static_inputs": engine.persistent_buffers(),
            "output_names": OUTPUT_NAMES[fn.__name__]}


def configure_with_context(fn, args) -> dict:
    """The same, with the forward-context getter declared as a static input (docs/audit.md)."""
    options = configure(fn, args)
    options["static_inputs"] = {**options["static_inputs"], "ctx": get_forward_context}
    return options


def audited_run(pair, bugs=(), every: int = 1, on_mismatch: str = "record", max_new=None, declare=configure,
                **engine_options):
    """(session, engine, requests): the engine built and run under the auto-audit."""
    target, eagle = pair
    prompts, default_max_new = workload()
    max_new = max_new or default_max_new
    with auto_audit(every=every, on_mismatch=on_mismatch, configure=declare) as session:
        engine = SpecEngine(target, eagle, bugs=bugs, **engine_options)
        requests = engine.generate(prompts, max_new)
    return session, engine, requests


def matching(session, kind: str, role: str | None, graph: str) -> list[dict]:
    """Diagnoses of `kind` naming a buffer containing `role` (None: naming none), in a graph whose name
    contains `graph`."""
    return [e.diagnosis for e in session.errors
            if e.kind == kind and graph in e.diagnosis["owner"]
            and (any(role in b for b in e.buffers) if role is not None else e.buffers == [])]
