"""A gpt-fast-style engine to try parity.audit on: static KV cache, decode graphs at batch 1/2/4, a draft graph.

    from examples.gpt_fast import Engine, audited_generate
    session, tokens, logits = audited_generate(lambda: Engine(bugs={"stale"}), [5, 9, 17], [6, 4, 2])
    print(session.errors[0])          # STALE_BUFFER (self.static.positions) in graph 'Engine.draft_graph' ...

See docs/audit-quickstart.md; `audit.py` is the whole of the glue.
"""

from examples.gpt_fast.audit import audited_generate
from examples.gpt_fast.engine import BUGS, Engine

__all__ = ["BUGS", "Engine", "audited_generate"]
