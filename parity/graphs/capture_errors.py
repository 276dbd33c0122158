"""An op a graph cannot capture (a host sync, a data-dependent shape), located at the engine's source line.

CUDA refuses a host sync while a stream captures (`.item()`, `.tolist()`,
`.cpu()`, `torch.cuda.synchronize()`, `nonzero`, boolean-mask indexing); the
emulated backend refuses the same ops (`graphs/emulated.py`). Either way the
error surfaces deep inside torch (the aten op, a dispatch mode, a C++ check):
`CaptureError` says which graph was being captured and the line of the
engine's (or the user's) code that made the call: the innermost frame of the
traceback outside torch, the standard library and this package's capture
machinery.
"""

from __future__ import annotations

import inspect
import linecache
import os
import sys
import sysconfig
import traceback
from dataclasses import dataclass

import torch

from parity.graphs.descriptor import CapturedFor

_INTERNAL = tuple(os.path.normcase(os.path.realpath(p)) + os.sep for p in (
    os.path.dirname(torch.__file__),                      # torch: the aten op, dispatch modes, torch.cuda
    sysconfig.get_paths()["stdlib"],                      # contextlib, functools, ...
    os.path.dirname(os.path.abspath(__file__)),           # parity/graphs: capture, recorders, executors
))


@dataclass(frozen=True)
class Source:
    """One line of code: its file (relative to the import root it was loaded from), line, function (qualified:
    `Class.method`), text."""

    file: str
    line: int
    function: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.file}:{self.line}"


class CaptureError(RuntimeError):
    """A graph's capture stopped at an op no graph can capture; `source` is the engine line that called it."""

    def __init__(self, captured_for: CapturedFor, num_reqs: int, source: Source | None, message: str):
        self.captured_for = captured_for
        self.num_reqs = num_reqs      # the rows it was captured with (token-keyed graphs pad rows like tokens)
        self.source = source
        self.message = message
        where = f" at {source.name} ({source.function}: {source.code})" if source else ""
        super().__init__(f"capturing the {captured_for.describe()}{where}: {message}")

    def as_dict(self) -> dict:
        source = self.source
        return {**self.captured_for.as_dict(), "num_reqs": self.num_reqs, "source": source.name if source else None,
                "function": source.function if source else None, "code": source.code if source else None,
                "message": self.message}


def engine_source(tb) -> Source | None:
    """The innermost frame of traceback `tb` in the engine's or the user's code (not torch's, the standard
    library's or the capture machinery's), or None when every frame is internal."""
    found = None
    for frame, line in traceback.walk_tb(tb):
        path = os.path.normcase(os.path.realpath(frame.f_code.co_filename))
        if not path.startswith(_INTERNAL):
            found = (frame.f_code.co_filename, line, getattr(frame.f_code, "co_qualname", frame.f_code.co_name))
    if found is None:
        return None
    filename, line, function = found
    return Source(import_name(filename), line, function, linecache.getline(filename, line).strip())


def import_name(filename: str) -> str:
    """`filename` relative to the longest import root (sys.path entry) it lies under, else as given: the same
    name wherever the tree was checked out or copied to."""
    path = os.path.realpath(filename)
    roots = [os.path.realpath(p or os.getcwd()) for p in sys.path]
    under = [r for r in roots if path.startswith(r.rstrip(os.sep) + os.sep)]
    if not under:
        return filename
    return os.path.relpath(path, max(under, key=len)).replace(os.sep, "/")


def source_of(function, needle: str) -> str:
    """`file:line` of the first line of `function` containing `needle` (how a catalog names a planted line)."""
    lines, first = inspect.getsourcelines(function)
    offset = next(i for i, text in enumerate(lines) if needle in text)
    return f"{import_name(inspect.getsourcefile(function))}:{first + offset}"
