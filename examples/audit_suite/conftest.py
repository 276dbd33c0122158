"""An engine's own test suite, as its developers would write it: nothing in it knows about the audit.

Run it plainly and it passes, planted bug or not (a broken drafter only lowers
acceptance; greedy output stays right). Run it with `--parity-audit` and every
graph the engine captures is checked against its eager run:

    pytest examples/audit_suite --parity-audit
    PARITY_AUDIT_EXAMPLE_BUGS=frozen pytest examples/audit_suite --parity-audit   # fails, with the panel

(`-p parity.audit.pytest_plugin` when eagle-parity is not pip-installed.)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the second engine lives under tests/
from tests.second_engine import SpecEngine, load_pair  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def pair():
    return load_pair("cuda" if torch.cuda.is_available() else "cpu")


def _plugin_loaded(config) -> bool:
    # registered as "parity_audit" by the entry point, by module name with -p
    return any(config.pluginmanager.hasplugin(name) for name in ("parity_audit", "parity.audit.pytest_plugin"))


@pytest.fixture
def engine(pair, request):
    bugs = [b for b in os.environ.get("PARITY_AUDIT_EXAMPLE_BUGS", "").split(",") if b]
    if _plugin_loaded(request.config):
        # Tell the audit how many rows of a padded batch are real, so it can check padding is inert.
        graph_audit = request.getfixturevalue("graph_audit")
        graph_audit.configure = lambda fn, args: {"num_valid": lambda: fn.__self__.num_valid}
    return SpecEngine(*pair, bugs=bugs)
