"""`parity --help`, every command's `--help` and a bad flag answer without importing torch, transformers or pandas:
the parser is built from each command's light arguments (commands/<command>_args.py), and a command's own
module, the seconds of imports with it, is imported only when the command runs.

This process has torch imported already, so the check runs in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "pandas")
HELPS = [["--help"]] + [[*command, "--help"] for command in (
    ["run"], ["bisect"], ["faults"], ["faults", "matrix"], ["report"], ["gate"], ["import"], ["models"],
    ["models", "synth"], ["scenarios"], ["bench"], ["bench", "scale"], ["bench", "false-alarms"])]
USAGE_ERROR = ["run", "--seed", "x"]

PROBE = f"""
import contextlib, io, json, sys

from parity.cli import main

codes, err = [], io.StringIO()
for argv in {HELPS + [USAGE_ERROR]!r}:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            codes.append(main(argv))
        except SystemExit as exc:      # --help exits 0
            codes.append(exc.code)
print(json.dumps({{"codes": codes, "stderr": err.getvalue(), "loaded": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def test_help_and_a_bad_flag_import_no_torch_transformers_or_pandas():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["codes"] == [0] * len(HELPS) + [2]
    assert result["stderr"] == "parity: error: parity run: argument --seed: invalid int value: 'x'\n"
    assert result["loaded"] == [], f"--help or a bad flag imported {result['loaded']}"
