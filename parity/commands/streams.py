"""A command's standard output: a reader that leaves early, an encoding that lacks a character, or a
terminal width that cannot hold a line end the output or degrade it, never the run.

`parity run --verbose ... | head -1`: the reader goes after one line, and the
next write raises BrokenPipeError. That must not lose the run (its folder is
saved after the console lines) nor turn a PASS into exit 1 under `set -o
pipefail`. So the first broken write points the stream at /dev/null (so the
interpreter's own flush at exit succeeds too) and the command goes on, exiting
with its verdict. A character the stream's encoding lacks (PYTHONIOENCODING=ascii)
is written as '?'. A COLUMNS too small to lay out a table (COLUMNS=0 printed
nothing at all, not even the verdict line) is ignored, as an unset one is.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys

MIN_COLUMNS = 40


class SurvivingStream:
    """Wraps a text stream: writes after the reader has gone are dropped; unencodable characters become '?'."""

    def __init__(self, stream):
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        if self.reader_gone:
            return len(text)
        try:
            return self._guarded(lambda: self._stream.write(text))
        except UnicodeEncodeError:
            encoding = getattr(self._stream, "encoding", None) or "ascii"
            return self._guarded(lambda: self._stream.write(text.encode(encoding, "replace").decode(encoding)))

    def flush(self) -> None:
        if not self.reader_gone:
            self._guarded(self._stream.flush)

    def _guarded(self, call):
        try:
            return call()
        except BrokenPipeError:
            self._gone()
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            self._gone()
        return 0

    def _gone(self) -> None:
        self.reader_gone = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def surviving_stdout():
    """sys.stdout as a SurvivingStream, and a COLUMNS below MIN_COLUMNS ignored, while a command runs."""
    original, columns = sys.stdout, os.environ.get("COLUMNS")
    if columns is not None and not (columns.strip().isdigit() and int(columns) >= MIN_COLUMNS):
        del os.environ["COLUMNS"]
    sys.stdout = SurvivingStream(original)
    try:
        yield sys.stdout
    finally:
        sys.stdout = original
        if columns is not None:
            os.environ["COLUMNS"] = columns
