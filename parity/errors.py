"""Errors the CLI turns into one line and exit code 2."""


class ParityInputError(Exception):
    """Bad user input: a file, a model, a scenario, an option. Exit 2, one line."""


class CaptureSyncError(RuntimeError):
    """A host sync (item(), nonzero, ...) happened while capturing a graph."""


class OutOfDeviceMemory(ParityInputError):
    """A run ran out of device memory: one line naming the mode, the figures and the knob to lower. Exit 2."""
