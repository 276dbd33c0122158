"""Files written whole or not at all: a temp file beside the target, renamed over it once complete.

Every file gets the mode an ordinary `open()` would give it (0666 less the
umask), not the 0600 of a private temp file, so a run folder reads alike for
every user a CI uploader runs as; folders likewise get 0777 less the umask.
The data is flushed to disk before the rename, so a crash or a power cut
leaves the old file or the new one, never an empty or truncated one. A temp
file a SIGKILL left behind is hidden (its name starts with '.') and is removed
by the next write to the same path once it is older than STALE_SECONDS.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

STALE_SECONDS = 3600          # a temp file or staging folder this old belongs to no live writer
_RENAME_NOREPLACE = 1         # renameat2(2) flag: fail with EEXIST instead of replacing
_AT_FDCWD = -100


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a newly created file gets under the current umask."""
    return 0o666 & ~_umask()


def dir_mode() -> int:
    """The mode a newly created folder gets under the current umask (mkdtemp's are 0700 whatever it is)."""
    return 0o777 & ~_umask()


def fsync_dir(path: str | Path) -> None:
    """Make a rename in `path` durable (best effort: some filesystems refuse to open folders)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def rename_noreplace(src: str | Path, dst: str | Path) -> None:
    """Rename `src` to `dst`, raising FileExistsError if `dst` exists: never replaces anything silently.

    Linux's renameat2(RENAME_NOREPLACE) makes the check and the rename one step; elsewhere (or on a
    filesystem without it) an existence check comes first, and rename(2) itself still refuses to
    replace a non-empty folder, so only an empty folder created in between could be replaced.
    """
    libc = _libc()
    if libc is not None:
        if libc.renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(err, os.strerror(err), str(dst))
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), str(src), None, str(dst))
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    try:
        os.rename(src, dst)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst)) from None
        raise


@contextlib.contextmanager
def atomic_file(path: str | Path, binary: bool = False):
    """Yield a handle on a temp file beside `path`; on success it replaces `path`, on failure it is removed."""
    path = Path(path)
    remove_stale(path.parent, f".{glob.escape(path.name)}.*.tmp")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def remove_stale(folder: str | Path, pattern: str, older_than: float = STALE_SECONDS,
                 dirs_only: bool = False) -> list[Path]:
    """Remove what a killed writer left in `folder` (names matching `pattern`) once older than `older_than` s.

    Best effort: a leftover another process removes first, or one we may not remove, is skipped.
    """
    removed, now = [], time.time()
    with contextlib.suppress(OSError):
        for leftover in Path(folder).glob(pattern):
            with contextlib.suppress(OSError):
                if now - leftover.lstat().st_mtime <= older_than:
                    continue
                if leftover.is_dir() and not leftover.is_symlink():
                    shutil.rmtree(leftover)
                elif dirs_only:
                    continue
                else:
                    leftover.unlink()
                removed.append(leftover)
    return removed


def write_text(path: str | Path, text: str) -> Path:
    with atomic_file(path) as handle:
        handle.write(text)
    return Path(path)


def write_json(path: str | Path, data, sort_keys: bool = False) -> Path:
    with atomic_file(path) as handle:
        json.dump(data, handle, indent=2, sort_keys=sort_keys, default=str)
        handle.write("\n")
    return Path(path)


_LIBC: list = []


def _libc():
    """The C library when it offers renameat2 (Linux, glibc 2.28+), else None."""
    if not _LIBC:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            _LIBC.append(libc if hasattr(libc, "renameat2") else None)
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]
