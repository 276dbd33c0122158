"""The options a GraphAudit takes, their defaults, and the one-line error for anything else.

An option the audit does not know is never ignored: a misspelt `num_vaild`
would silently turn the padding check off. Every way of making an audit
(GraphAudit, audited_graph, graphed, an AuditSession's configure) goes
through `resolve`.
"""

from __future__ import annotations

DEFAULTS = {
    "static_inputs": None,          # {name: tensor | object | zero-argument getter} the graph reads
    "every": 1,                     # shadow-check every N-th replay; 0: cheap checks only
    "on_mismatch": "raise",         # "raise" a GraphParityError or "record" it in audit.errors
    "num_valid": None,              # real rows of the padded batch: an int or a zero-argument callable
    "padding": None,                # {role name: poison value}: overrides the padding check's poison
    "padded_rows": None,            # the graph's batch size (default: leading dimension of its first output)
    "output_names": None,           # names of the callable's output tensors, in order
    "not_refreshed_after": 8,       # replays after which a declared input never written is reported
}


class AuditConfigError(ValueError):
    """An audit configured in a way it would silently ignore: one line saying what to do instead."""


def resolve(options: dict, where: str) -> dict:
    """The options with defaults filled in; AuditConfigError naming an unknown one and the known ones."""
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise AuditConfigError(f"{where}: unknown option {', '.join(map(repr, unknown))}; known: "
                               f"{', '.join(['name', *DEFAULTS])}")
    resolved = {**DEFAULTS, **options}
    if resolved["on_mismatch"] not in ("raise", "record"):
        raise AuditConfigError(f"{where}: on_mismatch must be 'raise' or 'record', not {resolved['on_mismatch']!r}")
    if not isinstance(resolved["every"], int) or resolved["every"] < 0:
        raise AuditConfigError(f"{where}: every must be an int >= 0, not {resolved['every']!r}")
    return resolved
