"""The second engine's audited workload, run the way a user runs it (docs/audit-quickstart.md).

The engine (tests/second_engine, patched or not) is built and run inside
`auto_audit`, with only what its developer declares once (`tests/audit_helpers.configure`:
the real rows, the persistent buffers, output names); nothing tells the audit
where to look. What the audit said comes back as plain data:

    python -m tests.bugs.second_run --device cuda --out FILE.json   # in the patched tree, a fresh interpreter
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

KEYS = ("kind", "buffers", "owner", "replays", "rows", "evidence", "experiment", "ruled_out")


def audit_workload(device: str) -> dict:
    """Errors and findings of the audit over the workload, and whether the graphed outputs equal eager's."""
    import torch

    from tests.audit_helpers import audited_run, workload
    from tests.second_engine import SpecEngine, load_pair

    torch.manual_seed(0)
    pair = load_pair(device)
    session, _, requests = audited_run(pair)
    eager = SpecEngine(*pair, graphs=False).generate(*workload())
    same = [(r.out, r.logprobs) for r in requests] == [(r.out, r.logprobs) for r in eager]
    return {"graphs": [a.name for a in session.audits], "outputs_match_eager": same,
            "errors": [{k: e.diagnosis.get(k) for k in KEYS} for e in session.errors],
            "findings": [{"kind": f.get("kind"), "buffers": f.get("buffers")} for f in session.findings]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tests.bugs.second_run", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.write_text(json.dumps(audit_workload(args.device), default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
