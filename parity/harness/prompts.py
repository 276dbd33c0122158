"""Prompt sets (JSONL) and the reading of user text files: UTF-8 or one line saying where it is not.

A user's file may be anything: another encoding (Latin-1, UTF-16), binary
junk, a gigabyte, a folder, a name no file can have. Each comes back as one
ParityInputError line naming the file and, when it helps, the line, never as
a UnicodeDecodeError or OSError traceback. Values quoted in messages go
through `show`, which cuts long and deeply nested values short.
"""

from __future__ import annotations

import json
import reprlib
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


def read_text_file(path: Path, what: str) -> str:
    """A UTF-8 text file (a BOM is allowed), or one ParityInputError line saying what is wrong and where."""
    try:
        data = path.read_bytes() if path.stat().st_size <= MAX_FILE_BYTES else None
    except OSError as exc:
        raise ParityInputError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    if data is None:
        raise ParityInputError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB: not a {what}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ParityInputError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); "
                               f"a {what} is a UTF-8 text file") from None


def read_prompts(path: Path) -> list[tuple[str, str]]:
    """(id, text) of every non-blank line of a JSONL prompt set; a bad line is named by its number."""
    prompts = []
    for number, line in enumerate(read_text_file(path, "prompt set (JSONL)").split("\n"), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            prompt = (str(item.get("id", f"p{len(prompts)}")), str(item["text"]))
            "".join(prompt).encode("utf-8")        # lone surrogates ("\ud800") are not text a tokenizer takes
        except (json.JSONDecodeError, KeyError, AttributeError, TypeError, RecursionError):
            raise ParityInputError(f"{path}:{number}: expected a JSON object with a 'text' field") from None
        except UnicodeEncodeError:
            raise ParityInputError(f"{path}:{number}: the text holds an unpaired surrogate escape "
                                   f"(e.g. \\ud800): not valid Unicode") from None
        prompts.append(prompt)
    if not prompts:
        raise ParityInputError(f"{path}:1: the prompt set is empty")
    return prompts
