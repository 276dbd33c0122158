"""Runs sharing the GPU through the private MPS daemon equal runs one after another, bit for bit (CUDA).

The daemon must be started before the process that uses it touches CUDA, so
the concurrent session runs in a fresh interpreter that starts it first, as
`parity` does, and hands its outcome back pickled (runs that came back from
workers hold no tensors); the sequential session runs here, with no MPS.
"""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from parity.harness import mps
from parity.harness.request import RunRequest
from parity.harness.session import run_session
from tests.test_concurrent_runs import MODES, assert_same_runs, tiny_scenario

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import pickle, sys
from parity.harness import mps
used = mps.start(["run"])
from tests.test_gpu_mps import session
with open(sys.argv[2], "wb") as f:
    pickle.dump((used, session(sys.argv[1], jobs=4)), f)
"""


def session(scenario: str, jobs: int):
    return run_session(RunRequest("tiny-llama3-eagle", scenario, MODES, "cuda", bisect=False, dtype="bfloat16",
                                  jobs=jobs))


@pytest.mark.skipif(shutil.which(mps.CONTROL) is None, reason=f"no {mps.CONTROL}")
def test_five_modes_sharing_the_gpu_through_mps_equal_one_after_another(tmp_path):
    scenario, out = tiny_scenario(tmp_path), tmp_path / "outcome.pkl"
    child = subprocess.run([sys.executable, "-c", CHILD, scenario, str(out)], cwd=ROOT, capture_output=True,
                           text=True, timeout=500)
    assert child.returncode == 0, child.stdout[-2000:] + child.stderr[-4000:]
    used, concurrent = pickle.loads(out.read_bytes())
    assert used == "private" and concurrent.summary["measured"]["concurrency"]["mps"] == "private"
    assert concurrent.summary["measured"]["concurrency"]["concurrent"]
    assert_same_runs(concurrent, session(scenario, jobs=1))
