"""What a diagnosis is, for every layer: the kinds and their meanings, the record, the panel.

`kinds.py` is the one table of bug kinds with what each means; `record.py` the
one `Diagnosis` record (its `as_dict()` is what `parity bisect --json` prints
and what `parity.audit` hands its users); `panel.py` the one rich panel of a
diagnosis dict (data in, text out). Every room may import this one; it imports
nothing of ours, so `parity.audit` stays importable without the harness.
"""
