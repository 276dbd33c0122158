"""parity.audit: check any CUDA-graphed callable against its own eager run, bitwise.

A graph replay must be bitwise equal to the same callable run eagerly at the
same padded shape on the same live inputs. Wrap the callable you capture in a
`GraphAudit`; each replay is then checked (every N-th with a shadow eager run),
and a mismatch is localised by one-variable experiments to a named buffer or
value: STALE_BUFFER, BUFFER_REASSIGNED, FROZEN_AT_CAPTURE, PADDING_LEAK,
POOL_ALIAS (or CAPTURE_CONTEXT / UNEXPLAINED with what was ruled out); a
program reading an output another replay of its forward overwrote is
OUTPUT_ALIASED, told at the read.

Public API (stable):
    GraphAudit, GraphParityError, GraphAuditWarning   the audit, its error and warning
    audited_graph, graphed, KeyedAudit                 adapters (torch.cuda.graph blocks,
                                                       make_graphed_callables-style callables,
                                                       a wrapper's runnable keyed by batch descriptor)
    auto_audit, AuditSession                           audit every capture in a block (what the
                                                       pytest plugin does per test)
    capturing, paused_gc                               mark a graph as being captured; no cyclic
                                                       GC inside a capture
    emulated                                           CPU stand-in for torch.cuda's graph API
    render_diagnosis, diagnosis_panel                  the rich panel
    DIAGNOSIS_KEYS                                     keys of every diagnosis dict
See docs/audit.md for the five-minute guide; pytest users: `pytest --parity-audit`.
"""

from parity.audit import emulated
from parity.audit.adapters import KeyedAudit, audited_graph, graphed
from parity.audit.audit import GraphAudit
from parity.audit.auto import AuditSession, auto_audit
from parity.audit.capture import capturing, paused_gc
from parity.audit.diagnosis import GraphAuditWarning, GraphParityError
from parity.diagnosis.panel import diagnosis_panel, render_diagnosis
from parity.diagnosis.record import DIAGNOSIS_KEYS

__all__ = ["DIAGNOSIS_KEYS", "AuditSession", "GraphAudit", "GraphAuditWarning", "GraphParityError", "KeyedAudit",
           "audited_graph", "auto_audit", "capturing", "diagnosis_panel", "emulated", "graphed", "paused_gc",
           "render_diagnosis"]
