"""eagle-parity: graph-versus-eager parity harness for EAGLE speculative decoding."""

import os

# NOTE: MKL picks CPU kernels by the alignment of its operands unless told to reproduce strictly, so a run in a
# spawned worker and the same run in this process could differ in the last bits (measured on a 2-core AVX2
# AMD EPYC: the eager drafts' logprobs of tests/test_concurrent_runs.py). Set before MKL's first call (it
# reads the variable then); spawned workers inherit it. A value the user set is kept.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

__version__ = "0.1.0"
