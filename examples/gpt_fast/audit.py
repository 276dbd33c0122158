"""The glue a user writes to audit this engine: everything between the markers (tests count its lines)."""

# glue:start
from parity.audit import auto_audit


def audited_generate(make_engine, prompts, max_new, every=1):
    """Build and run the engine with every graph it captures audited; (session, tokens, logits)."""
    options = lambda fn, args: {"num_valid": lambda: fn.__self__.num_valid}   # noqa: E731 (real rows)
    with auto_audit(every=every, configure=options) as session:
        tokens, logits = make_engine().generate(prompts, max_new)
    return session, tokens, logits
# glue:end
