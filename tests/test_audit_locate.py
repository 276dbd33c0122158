"""Where an engine keeps a graph, as the audit names it: found with few scans of the heap, and never stale.

`locate.located` walks up a graph's referrers (`gc.get_referrers`, a scan of
the whole heap each); a dict's owner (the object whose `__dict__` it is) is
remembered weakly and checked at every use, so a dict handed to another
object, or an owner gone, is looked up again rather than named wrong.
"""

from __future__ import annotations

import gc

import pytest

from parity.audit import locate


class Graph:
    pass


class Engine:
    def __init__(self):
        self.decode = {bs: Graph() for bs in (1, 2, 4)}
        self.prefill = Graph()


def test_graphs_are_named_by_their_holder_with_few_scans(monkeypatch):
    engine = Engine()
    scans = []
    real = gc.get_referrers
    monkeypatch.setattr(locate.gc, "get_referrers", lambda *objs: scans.append(len(objs)) or real(*objs))
    assert locate.located(engine.prefill) == "Engine.prefill"
    names = [locate.located(engine.decode[bs]) for bs in (1, 2, 4)]
    assert names == ["Engine.decode[1]", "Engine.decode[2]", "Engine.decode[4]"]
    # Each decode graph: its referrers (the dict keyed by batch size: no object's __dict__, no scan for an owner),
    # then the dict's referrers, whose owner (Engine's __dict__) is remembered from the first graph.
    assert len(scans) <= 1 + 2 + 3 * 2, scans


@pytest.mark.parametrize("first_goes", [False, True], ids=["first given a new dict", "first gone"])
def test_a_remembered_owner_is_checked_before_it_is_used(first_goes):
    first = Engine()
    vars(first)                            # its attributes in a dict object (CPython keeps them inline until asked)
    assert locate.located(first.prefill) == "Engine.prefill"      # the dict's owner is remembered
    runner = type("Runner", (), {})()
    runner.__dict__ = first.__dict__       # the same dict, now another object's
    if first_goes:
        del first
        gc.collect()
    else:
        first.__dict__ = {}
    assert locate.located(runner.prefill) == "Runner.prefill"
