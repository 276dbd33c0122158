"""What a mutation reads that the engine's own steps do not take: kept on the part for one call only.

The engine's named steps take only what they read (`draft_column(n)`, not the
metadata as well), so a mutation that needs more (the host draft step of the
forward's metadata, the rows of the batch being built) picks it up from the
enclosing call its mixin also overrides (the captured body gets the forward's
metadata, `build` the batch's rows). The value is kept for that call's duration
only, so the part's attributes are the same before and after it.
"""

from __future__ import annotations

from contextlib import contextmanager


_ABSENT = object()


@contextmanager
def kept(part, name: str, value):
    """`part.<name>` is `value` while the block runs, and what it was (or nothing) after it."""
    before = part.__dict__.get(name, _ABSENT)
    setattr(part, name, value)
    try:
        yield
    finally:
        if before is _ABSENT:
            delattr(part, name)
        else:
            setattr(part, name, before)


class SeesDraftMeta:
    """The drafter's steps inside a draft forward (prefill or decode step) see its metadata as `forward_meta`."""

    def prefill_forward(self, num_tokens_padded, num_reqs_padded, meta):
        with kept(self, "forward_meta", meta):
            return super().prefill_forward(num_tokens_padded, num_reqs_padded, meta)

    def step_forward(self, num_tokens_padded, num_reqs_padded, meta):
        with kept(self, "forward_meta", meta):
            return super().step_forward(num_tokens_padded, num_reqs_padded, meta)


class SeesTargetMeta:
    """The target's steps inside its verify forward see its metadata as `forward_meta`."""

    def verify(self, num_tokens_padded, num_reqs_padded, meta):
        with kept(self, "forward_meta", meta):
            return super().verify(num_tokens_padded, num_reqs_padded, meta)
