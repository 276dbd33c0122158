"""Prompt sets (JSONL): one (id, text) per line, or one line naming the file and line that is not."""

from __future__ import annotations

import json
from pathlib import Path

from parity.errors import ParityInputError
from parity.files import read_text_file, show


def read_prompts(path: Path) -> list[tuple[str, str]]:
    """(id, text) of every non-blank line of a JSONL prompt set; a bad line is named by its number."""
    prompts = []
    for number, line in enumerate(read_text_file(path, "prompt set (JSONL)").split("\n"), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            raise ParityInputError(f"{path}:{number}: expected a JSON object with a 'text' field") from None
        if not isinstance(item, dict) or "text" not in item:
            raise ParityInputError(f"{path}:{number}: expected a JSON object with a 'text' field")
        text, ident = item["text"], item.get("id", f"p{len(prompts)}")
        # NOTE: no coercion: a number or null where text belongs is a broken file, not the prompt "5" or "None".
        if not isinstance(text, str) or not text:
            raise ParityInputError(f"{path}:{number}: 'text' must be a non-empty string, got {show(text)}")
        if not isinstance(ident, (str, int)) or isinstance(ident, bool):
            raise ParityInputError(f"{path}:{number}: 'id' must be a string or an integer, got {show(ident)}")
        prompt = (str(ident), text)
        try:
            "".join(prompt).encode("utf-8")        # lone surrogates ("\ud800") are not text a tokenizer takes
        except UnicodeEncodeError:
            raise ParityInputError(f"{path}:{number}: the text holds an unpaired surrogate escape "
                                   f"(e.g. \\ud800): not valid Unicode") from None
        prompts.append(prompt)
    if not prompts:
        raise ParityInputError(f"{path}:1: the prompt set is empty")
    return prompts
