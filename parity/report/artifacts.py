"""Run folders under reports/<run-id>/: written whole into a hidden sibling, then renamed into place.

A run folder is either complete or absent. Every artifact is written into a
staging folder `.<name>.parity-staging-XXXX` beside the final one; only when all of them
are on disk does one rename make the folder appear, and that rename never
replaces anything: a folder of the same name (another run that started in the
same second, or wrote to the same --out) makes it fail instead, and the caller
picks another name or refuses. Replacing an old run is explicit (`replace`,
the commands' --force) and only ever replaces a run folder or an empty one.

A staging folder is hidden, refused by `parity report`, removed when anything
fails or is interrupted, and, when a SIGKILL left one behind, removed by the
next run writing beside it once it is older than atomic.STALE_SECONDS. Every
file gets the mode an ordinary open() would give (0666 less the umask) and
every folder 0777 less the umask, whatever pyarrow, matplotlib or mkdtemp
(0700) chose.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from parity.errors import ParityInputError
from parity.report.atomic import dir_mode, file_mode, fsync_dir, remove_stale, rename_noreplace, write_json

STAGING_MARK = ".parity-staging-"   # distinctive: the stale clean-up must never match a user's file
_PREFIX_CHARS = 100    # of the final name kept in the staging folder's name (NAME_MAX is 255 bytes)


def is_staging(path: str | Path) -> bool:
    """True for a staging folder: a run still being written, or one a killed run left behind."""
    name = Path(path).name
    return name.startswith(".") and STAGING_MARK in name


def holds_run(path: str | Path) -> bool:
    """True for a folder `parity run` or `parity gate --out` wrote (it has summary.json)."""
    return (Path(path) / "summary.json").is_file()


def check_out_dir(out: str | Path, force: bool = False, option: str = "--out") -> None:
    """Before a run: refuse an output folder the run could not be placed in, so no run is wasted."""
    path = Path(os.path.abspath(out))
    if path.name in ("", ".", ".."):
        raise ParityInputError(f"{option} {out}: not a folder a run can be written to")
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            raise ParityInputError(f"{option} {out}: is a file, not a folder")
        if holds_run(path):
            if not force:
                raise ParityInputError(f"{option} {out}: already holds a run; pass --force to replace it, "
                                       f"or choose another folder")
        elif any(path.iterdir()):
            raise ParityInputError(f"{option} {out}: a folder that is not empty and holds no run; refusing to "
                                   f"write into it (--force replaces run folders only)")
    parent = next(p for p in path.parents if p.exists() or p == Path(p.anchor))
    if not parent.is_dir():
        raise ParityInputError(f"{option} {out}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ParityInputError(f"{option} {out}: permission denied: cannot create folders in {parent}")


def records_frame(runs, table: str) -> pd.DataFrame:
    """One table of every run (graph modes and padded references), with a `mode` column first."""
    runs = runs.all_runs() if hasattr(runs, "all_runs") else runs
    frames = []
    for mode, run in runs.items():
        if run.result is None:      # refused by the capacity audit: no records
            continue
        frame = getattr(run.result, table).copy()
        frame.insert(0, "mode", mode)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def write_run(out_dir: str | Path, summary: dict, runs: dict, extra_writers=(), *, replace: bool = False,
              others=()) -> Path:
    """Write every artifact into a staging folder beside `out_dir`, then rename it into place.

    The folder lands at `out_dir`, or, when a folder of that name appeared meanwhile, at the first of
    `others` (more names to try) still free; returns where. `replace` lets it replace a run at `out_dir`.
    Raises FileExistsError when every name is taken; the staging folder never outlives a failure.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out_dir.parent, f".*{STAGING_MARK}*", dirs_only=True)
    prefix = f".{out_dir.name[:_PREFIX_CHARS]}{STAGING_MARK}"
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=prefix))
    try:
        write_json(staging / "summary.json", summary)
        for table, name in (("drafts", "records"), ("tokens", "tokens"), ("forwards", "forwards")):
            records_frame(runs, table).to_parquet(staging / f"{name}.parquet", index=False)
        for writer in extra_writers:
            writer(staging, summary)
        settle(staging)
        placed = _place(staging, out_dir, replace, others)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    fsync_dir(placed.parent)
    return placed


def settle(folder: Path) -> None:
    """Give every file the umask's file mode and every folder its folder mode, and flush them to disk."""
    for root, dirs, files in os.walk(folder):
        os.chmod(root, dir_mode())
        for name in dirs:
            os.chmod(Path(root) / name, dir_mode())
        for name in files:
            file = Path(root) / name
            os.chmod(file, file_mode())
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _place(staging: Path, out_dir: Path, replace: bool, others) -> Path:
    for target in (out_dir, *others):
        target = Path(target)
        try:
            if replace and target == out_dir:
                _replace(staging, target)
            else:
                with contextlib.suppress(OSError):   # an empty folder (mkdir'd by a user) may be taken
                    target.rmdir()
                rename_noreplace(staging, target)
            return target
        except FileExistsError:
            continue
    raise FileExistsError(f"{out_dir}: a folder of that name exists (and so does every other name tried)")


def _replace(staging: Path, out_dir: Path) -> None:
    """--force: move the old run aside (hidden), put the new one in place, then delete the old one."""
    if not (out_dir.exists() or out_dir.is_symlink()):
        rename_noreplace(staging, out_dir)
        return
    if not out_dir.is_dir() or (not holds_run(out_dir) and any(out_dir.iterdir())):
        raise ParityInputError(f"--out {out_dir}: no longer a run folder; refusing to replace it")
    old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name[:_PREFIX_CHARS]}{STAGING_MARK}old-"))
    os.rename(out_dir, old / "run")
    try:
        rename_noreplace(staging, out_dir)
    except BaseException:
        os.rename(old / "run", out_dir)
        old.rmdir()
        raise
    shutil.rmtree(old, ignore_errors=True)
