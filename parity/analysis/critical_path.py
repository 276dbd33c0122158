"""The critical path of a session's runs: which run bounded the wall time, and how much ran at once.

From each run's span (start and end on one clock), relative to the session's
start:
- `bounded_by`: the run that ended last; the runs phase could not end before it;
- `path`: that run, then the run whose end let it start (the latest-ending run
  that ended no later than it started), and so on back to a run that started
  with the phase: the chain of runs the wall time waited on;
- `concurrency`: the sum of the runs' durations over the runs phase's wall
  time (1.0 one after another; N when N runs always overlapped).
"""

from __future__ import annotations

# Spans closer than this (seconds) count as touching: the time a scheduler takes to start the next run.
TOUCH = 0.05


def critical_path(spans: dict[str, tuple[float, float]], origin: float) -> dict | None:
    """The block described above, every time in seconds since `origin`; None without spans."""
    if not spans:
        return None
    rel = {name: (round(start - origin, 3), round(end - origin, 3)) for name, (start, end) in spans.items()}
    first = min(start for start, _ in rel.values())
    last = max(end for _, end in rel.values())
    wall = last - first
    busy = sum(end - start for start, end in rel.values())
    bound = max(rel, key=lambda name: rel[name][1])
    path = [bound]
    while rel[path[-1]][0] - first > TOUCH:
        start = rel[path[-1]][0]
        before = [n for n, (_, end) in rel.items() if end <= start + TOUCH and n not in path]
        if not before:
            break
        path.append(max(before, key=lambda name: rel[name][1]))
    return {"bounded_by": bound, "path": path[::-1],
            "runs_start_seconds": round(first, 3), "runs_end_seconds": round(last, 3),
            "runs_wall_seconds": round(wall, 3), "busy_seconds": round(busy, 3),
            "concurrency": round(busy / wall, 2) if wall > 0 else 1.0,
            "spans": {name: {"start_seconds": s, "end_seconds": e} for name, (s, e) in rel.items()}}
