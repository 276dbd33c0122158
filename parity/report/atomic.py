"""Files written whole or not at all: a temp file beside the target, renamed over it once complete.

Every file gets the mode an ordinary `open()` would give it (0666 less the
umask), not the 0600 of a private temp file, so a run folder reads alike for
every user a CI uploader runs as.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a newly created file gets under the current umask."""
    return 0o666 & ~_umask()


@contextlib.contextmanager
def atomic_file(path: str | Path, binary: bool = False):
    """Yield a handle on a temp file beside `path`; on success it replaces `path`, on failure it is removed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as handle:
            yield handle
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> Path:
    with atomic_file(path) as handle:
        handle.write(text)
    return Path(path)


def write_json(path: str | Path, data, sort_keys: bool = False) -> Path:
    with atomic_file(path) as handle:
        json.dump(data, handle, indent=2, sort_keys=sort_keys, default=str)
        handle.write("\n")
    return Path(path)
