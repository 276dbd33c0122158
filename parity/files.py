"""Reading user files: a regular file of bounded size, UTF-8, or one line saying what it is instead.

A user's file may be anything: another encoding (Latin-1, UTF-16), binary
junk, a gigabyte, a folder, a device that never ends (/dev/zero), a FIFO whose
open blocks until a writer comes, a name no file can have. Each comes back as
one ParityInputError line naming the file and, when it helps, the line, never
as a UnicodeDecodeError or OSError traceback and never as a hang. Values quoted
in messages go through `show`, which cuts long and deeply nested values short.
Every room reads user files through here (docs/architecture.md).
"""

from __future__ import annotations

import os
import reprlib
import stat
from pathlib import Path

from parity.errors import ParityInputError

MAX_FILE_BYTES = 16 << 20    # a scenario or a prompt set larger than this is not one
_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxlist, _SHOW.maxdict, _SHOW.maxstring, _SHOW.maxother = 3, 8, 8, 60, 60


def show(value) -> str:
    """A value for a message: its repr cut short (files can hold huge or self-repeating values)."""
    return _SHOW.repr(value)


def is_file(path: Path) -> bool:
    """Path.is_file() that answers False for names no file can have (NUL bytes, too long)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def read_text_file(path: Path, what: str, limit: int = MAX_FILE_BYTES) -> str:
    """A UTF-8 text file (a BOM is allowed), or one ParityInputError line saying what is wrong and where."""
    data = read_regular_file(path, what, limit)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ParityInputError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); "
                               f"a {what} is a UTF-8 text file") from None


def read_regular_file(path: Path, what: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; a device (/dev/zero), a FIFO (whose open blocks
    until a writer comes), a folder or a larger file is one ParityInputError line, read no further than that."""
    path = Path(path)
    try:
        # NOTE: opened without blocking and then asked what it is, so a FIFO put in its place after a check
        # cannot block the open, and nothing is read from a device.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
                    "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file"
                raise ParityInputError(f"{path}: {kind}, not a {what} file")
            with os.fdopen(os.dup(fd), "rb") as handle:
                data = handle.read(limit + 1)
        finally:
            os.close(fd)
    except OSError as exc:
        raise ParityInputError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    except ValueError:      # a NUL byte in the name
        raise ParityInputError(f"{show(str(path))}: no file can have this name") from None
    if len(data) > limit:
        raise ParityInputError(f"{path}: larger than {_size(limit)}: not a {what}")
    return data


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"
