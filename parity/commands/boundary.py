"""The one error boundary of the `parity` command line: every failure is one line and an exit code.

Users meet this tool in CI logs and terminals; a traceback there reads as
"the tool is broken" even when the input was. So every command runs inside
`guarded()`, which maps what we know to one line on stderr:

    bad input (ParityInputError), missing weights          -> 2
    out of memory (device or host)                         -> 2, naming what to lower
    unreadable / unwritable files, full disk (ENOSPC)      -> 2
    KeyboardInterrupt (SIGINT)                             -> 130
    SIGTERM (raised as errors.Terminated)                  -> 143
    anything else (a bug)                                  -> 3, traceback saved to a file

Once a signal has arrived, the signal's code wins over whatever escapes: a
library can catch our Terminated and raise an error of its own (torch did,
mid-load, and the weights were then reported corrupt).

SIGTERM is turned into an exception so that the `finally` and `except
BaseException` clauses that remove half-written run folders run before the
process exits; a second signal during that clean-up is ignored rather than
cutting it short. An unexpected exception's traceback goes to a uniquely
named file under the system temp folder, which the one line names, so it
can be attached to a bug report without flooding the log.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import sys
import tempfile
import threading
import time
import traceback

import parity
from parity.commands.options import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE, Parser
from parity.commands.streams import surviving_stdout
from parity.errors import ParityInputError, Terminated

OOM_HINT = ("lower max_num_seqs, max_num_batched_tokens or max_model_len (or list fewer capture_sizes) in the "
            "scenario, or run fewer --modes at a time")
# OSErrors that mean "this file or folder cannot be used", not "parity has a bug".
_USER_ERRNOS = {errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENOENT, errno.EISDIR,
                errno.ENOTDIR, errno.EEXIST, errno.ENOTEMPTY, errno.ENAMETOOLONG, errno.ELOOP, errno.EFBIG,
                errno.EMFILE, errno.ENFILE, errno.EIO, errno.ETXTBSY}
_HINTS = {errno.ENOSPC: "free some space or write elsewhere (--out)",
          errno.EDQUOT: "free some space or write elsewhere (--out)",
          errno.EACCES: "check the permissions, or write elsewhere (--out)",
          errno.EPERM: "check the permissions, or write elsewhere (--out)",
          errno.EROFS: "write elsewhere (--out)"}


def one_line(text: str) -> str:
    """`text` on one line: exceptions (YAML's, CUDA's) often carry several."""
    return re.sub(r"\s*[\r\n]+\s*", " ", str(text)).strip()


def say(message: str) -> None:
    print(f"parity: {one_line(message)}", file=sys.stderr, flush=True)


def run_command(argv: list[str] | None, commands, description: str | None = None) -> int:
    """`parity <argv>` with these command modules: parse and dispatch inside the boundary (`guarded`)."""

    def dispatch() -> int:
        parser = Parser(prog="parity", description=description)
        sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
        for command in commands:
            command.register(sub)
        args = parser.parse_args(argv)
        return args.handler(args)

    with surviving_stdout():
        return guarded(dispatch)


def guarded(call) -> int:
    """Run `call()` (a command; returns its exit code) and turn every failure into one line and a code."""
    with _signals_raise() as fired:
        try:
            return call()
        except ParityInputError as exc:
            if fired:
                return _signalled(fired[0])
            say(f"error: {exc}")
            return EXIT_USAGE
        except KeyboardInterrupt:
            return _signalled(signal.SIGINT)
        except Terminated:
            return _signalled(signal.SIGTERM)
        except Exception as exc:        # noqa: BLE001 - the boundary: every exception ends here
            # A library that turned our Terminated / KeyboardInterrupt into an error of its own (torch while
            # loading weights does) must not hide the signal behind a wrong cause: the signal wins.
            return _signalled(fired[0]) if fired else _unexpected_or_known(exc)


def _signalled(signum) -> int:
    if signum == signal.SIGINT:
        say("interrupted (no run folder was left half-written)")
        return EXIT_INTERRUPTED
    say("terminated (no run folder was left half-written)")
    return EXIT_TERMINATED


def _unexpected_or_known(exc: Exception) -> int:
    if is_out_of_memory(exc):
        say(f"error: out of memory ({_memory_detail(exc)}): {OOM_HINT}")
        return EXIT_USAGE
    if isinstance(exc, OSError) and exc.errno in _USER_ERRNOS:
        say(f"error: {describe_os_error(exc)}")
        return EXIT_USAGE
    path = save_traceback(exc)
    where = f"traceback saved to {path}" if path else "the traceback could not be saved"
    say(f"internal error: {exc.__class__.__name__}: {_short(exc)} ({where}; please attach it to a bug report)")
    return EXIT_INTERNAL


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, Python's MemoryError, or the CPU allocator's refusal."""
    import torch    # here, not at the top: a --help or a bad flag passes this boundary without torch

    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in str(exc) or "out of memory" in str(exc))


def _memory_detail(exc: BaseException) -> str:
    import torch

    device = "device" if isinstance(exc, torch.OutOfMemoryError) else "host"
    asked = re.search(r"[Tt]ried to allocate ([\d.]+ ?[KMGT]i?B)", str(exc)) or \
        re.search(r"allocate (\d+) bytes", str(exc))
    return f"{device}; tried to allocate {asked.group(1)}" if asked else device


def describe_os_error(exc: OSError) -> str:
    """'<file>: <reason>' (and what to do, when there is something obvious)."""
    name = exc.filename if exc.filename is not None else ""
    text = f"{name}: {exc.strerror or exc}" if name else f"{exc.strerror or exc}"
    if exc.filename2 is not None:
        text += f" (-> {exc.filename2})"
    hint = _HINTS.get(exc.errno)
    return f"{text}; {hint}" if hint else text


def _short(exc: BaseException, limit: int = 200) -> str:
    text = one_line(exc)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def save_traceback(exc: BaseException) -> str | None:
    """Write the traceback (with versions and argv) to a new file under the temp folder; its path, or None."""
    try:
        import torch

        stamp = time.strftime("%Y%m%d-%H%M%S")
        fd, path = tempfile.mkstemp(prefix=f"parity-traceback-{stamp}-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as handle:
            handle.write(f"parity {parity.__version__}, python {sys.version.split()[0]}, torch {torch.__version__}\n"
                         f"argv: {sys.argv!r}\ncwd: {os.getcwd()}\n\n")
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=handle)
        return path
    except Exception:   # noqa: BLE001 - nowhere to write: the one line says so
        return None


def _raise_once(kind, fired: list):
    """A handler raising `kind` on the first signal of either kind and ignoring the rest (clean-up runs whole)."""
    def handler(signum, frame):
        if not fired:
            fired.append(signum)
            raise kind()
    return handler


@contextlib.contextmanager
def _signals_raise():
    """SIGTERM raises Terminated and SIGINT KeyboardInterrupt, the first one only, while the command runs;
    yields the list the first signal's number lands in."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    fired: list = []
    signal.signal(signal.SIGTERM, _raise_once(Terminated, fired))
    signal.signal(signal.SIGINT, _raise_once(KeyboardInterrupt, fired))
    try:
        yield fired
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
