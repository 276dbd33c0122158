"""Errors the CLI turns into one line and an exit code (see commands/boundary.py)."""


class ParityInputError(Exception):
    """Bad user input: a file, a model, a scenario, an option. Exit 2, one line."""


class Terminated(BaseException):
    """SIGTERM arrived. A BaseException, like KeyboardInterrupt, so that no `except Exception` swallows it
    and every `finally` (removing a half-written run folder) still runs on the way out; exit 143."""


class CaptureSyncError(RuntimeError):
    """A host sync (item(), nonzero, ...) happened while capturing a graph."""


class OutOfDeviceMemory(ParityInputError):
    """A run ran out of device memory: one line naming the mode, the figures and the knob to lower. Exit 2."""
