"""pytest plugin: `pytest --parity-audit` checks every CUDA graph your tests capture against eager.

Loaded through the `pytest11` entry point of eagle-parity, named after this module so that
`-p parity.audit.pytest_plugin` (or `pytest_plugins = [...]`) finds it registered, not twice.
- `--parity-audit`: for each test (setup, call and teardown), `torch.cuda.CUDAGraph`
  and the emulated stand-in are patched so every capture is audited
  (`parity.audit.auto`); a replay that differs from its callable run eagerly
  fails the test with the diagnosis panel.
- `--parity-audit-every N` (ini `parity_audit_every`): shadow-check every N-th
  replay of each graph (cheap checks run at every replay). 16 suits CI.
- `graph_audit` fixture: the test's AuditSession: `graph_audit.wrap(fn, name=...)`
  for explicit audits, `graph_audit.configure = lambda fn, args: {...}` for
  options of auto-audited callables (num_valid, static_inputs, output_names),
  `graph_audit.auto()` to audit a block without the command-line option. Setting
  `configure` after a graph was captured is an error (it could not apply).
Diagnoses go to the JUnit XML as the test's `parity_audit` property (JSON).
"""

from __future__ import annotations

import json

import pytest

from parity.audit.auto import AuditSession, auto_audit
from parity.audit.diagnosis import GraphParityError, summary
from parity.diagnosis.panel import render_diagnosis

_SESSION = pytest.StashKey[AuditSession]()
_SCOPE = pytest.StashKey[object]()
_TOTALS = pytest.StashKey[dict]()


def pytest_addoption(parser):
    group = parser.getgroup("parity-audit", "graph-versus-eager parity of CUDA graphs (parity.audit)")
    group.addoption("--parity-audit", action="store_true", default=False,
                    help="audit every CUDA graph (and emulated graph) a test captures; a replay that is not "
                         "bitwise equal to its callable run eagerly fails the test with a diagnosis")
    group.addoption("--parity-audit-every", type=int, default=None, metavar="N",
                    help="shadow-check every N-th replay of each graph (default: ini parity_audit_every, or 1)")
    parser.addini("parity_audit_every", "shadow-check every N-th replay of each audited graph", default="1")


def pytest_configure(config):
    config.stash[_TOTALS] = {"audits": 0, "errors": 0}


def _every(config) -> int:
    option = config.getoption("parity_audit_every")
    return int(option if option is not None else config.getini("parity_audit_every"))


def session_of(item) -> AuditSession:
    """The AuditSession of a test item (made on first use)."""
    if _SESSION not in item.stash:
        item.stash[_SESSION] = AuditSession(every=_every(item.config), on_mismatch="record")
    return item.stash[_SESSION]


@pytest.fixture
def graph_audit(request) -> AuditSession:
    """This test's AuditSession: wrap callables, configure auto-audits, read errors and findings."""
    return session_of(request.node)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    session = session_of(item)
    if item.config.getoption("parity_audit"):
        scope = auto_audit(session=session)
        scope.__enter__()
        item.stash[_SCOPE] = scope
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    session = session_of(item)
    if session.errors:
        raise session.errors[0]
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield)
    finally:
        scope = item.stash.get(_SCOPE, None)
        if scope is not None:
            scope.__exit__(None, None, None)
            del item.stash[_SCOPE]
        session = item.stash.get(_SESSION, None)
        if session is not None:
            totals = item.config.stash[_TOTALS]
            totals["audits"] += len(session.audits)
            totals["errors"] += len(session.errors)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    session = item.stash.get(_SESSION, None)
    if session is None or call.when != "call" or not (session.errors or session.findings):
        return report
    diagnoses = [e.diagnosis for e in session.errors] + session.findings
    for name, value in (("parity_audit", json.dumps(diagnoses, default=str)),
                        ("parity_audit_kinds", ",".join(d["kind"] for d in diagnoses))):
        item.user_properties.append((name, value))
        if report.user_properties is not item.user_properties:
            report.user_properties.append((name, value))
    if session.errors:
        panels = "".join(render_diagnosis(e.diagnosis) for e in session.errors)
        if call.excinfo is not None and call.excinfo.errisinstance(GraphParityError):
            report.longrepr = "\n".join(summary(e.diagnosis) for e in session.errors) + "\n" + panels
        else:
            report.sections.append(("parity.audit", panels))
    return report


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    totals = config.stash.get(_TOTALS, None)
    if not totals or not (config.getoption("parity_audit") or totals["audits"]):
        return
    terminalreporter.section("parity.audit")
    terminalreporter.write_line(f"{totals['audits']} graph(s) audited, {totals['errors']} diagnosis(es)")
