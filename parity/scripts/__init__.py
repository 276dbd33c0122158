"""Release and profiling scripts, run as `python -m parity.scripts.NAME`: not `parity` commands, imported by nothing."""
