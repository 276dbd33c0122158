"""Runs at the same time compute what they compute one after another, bit for bit.

The CPU session is marked `costly` (`make test-costly`, which CI runs after
`make test`; the GPU one is in `make test-gpu`): each spawned worker imports torch and
transformers, ~10 s of CPU, which `make test` cannot afford; the rest is unit
tests of the width, the admission and the critical path, in `make test`.

- a session of the tiny pair in all five modes, once with `jobs=2` (two spawned
  workers mapping the parent's weights through shared memory, the same path
  CUDA takes through CUDA IPC) and once with `jobs=1` (this process): every
  run's records, outputs, replay counts and padding probe equal, the summary
  equal but for the measured block, and the measured block saying which it was;
  on CUDA the same (`@pytest.mark.gpu`), every worker's run leaving nothing allocated;
- the width: `--jobs 1`, the CPU default, the default for a pair under 1 GiB,
  no plan, parts a worker cannot receive, a budget that fits one run at a
  time: sequential, each with its reason; a budget that fits k: k;
- admission: a run waits while the runs in flight leave no room for it, and
  runs alone when nothing is in flight;
- the critical path of known spans: the run that ended last, the chain before
  it, the concurrency (busy time over the runs' wall time).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from parity.analysis.critical_path import critical_path
from parity.cli import main
from parity.engine.parts import EngineParts
from parity.engine.records import Records
from parity.harness.concurrency import AUTO_MAX, GIB, WORKER_OVERHEAD, Concurrency, Job, decide, session_jobs
from parity.harness.concurrent import _Schedule
from parity.harness.request import RunRequest
from parity.harness.workers import cpu_count
from parity.harness.session import run_session

ROOT = Path(__file__).resolve().parent.parent
MODES = ("eager", "piecewise", "full", "full_decode_only", "full_and_piecewise")


def tiny_scenario(tmp_path: Path) -> str:
    """Two requests, four tokens, four capture sizes: every mode and reference runs, in seconds."""
    text = (ROOT / "scenarios/default.yaml").read_text()
    text = text.replace("prompts: prompts/default.jsonl", f"prompts: {ROOT / 'scenarios/prompts/default.jsonl'}")
    text = text.replace("num_requests: 8", "num_requests: 2").replace("arrivals: [0, 0, 0, 1, 3, 5, 8, 12]",
                                                                     "arrivals: [0, 1]")
    text = text.replace("max_tokens: 32", "max_tokens: 4") + "capture_sizes: [1, 2, 4, 8]\n"
    path = tmp_path / "tiny.yaml"
    path.write_text(text)
    return str(path)


def assert_same_runs(one, other) -> None:
    a, b = one.runs.all_runs(), other.runs.all_runs()
    assert list(a) == list(b)
    for name in a:
        x, y = a[name], b[name]
        for frame in ("drafts", "tokens", "forwards"):
            assert getattr(x.result, frame).equals(getattr(y.result, frame)), (name, frame)
        assert x.result.outputs == y.result.outputs, name
        assert (x.graph_replays, x.padding_probe) == (y.graph_replays, y.padding_probe), name
    strip = lambda s: {k: v for k, v in s.items() if k not in ("measured", "created")}  # noqa: E731
    assert json.dumps(strip(one.summary), sort_keys=True, default=str) == \
        json.dumps(strip(other.summary), sort_keys=True, default=str)


def tensors_in(value, seen=None) -> int:
    """Tensors reachable in a run that came back from a worker: none may (on CUDA one would point into the memory
    of a process that has ended)."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return 0
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return 1
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = vars(value)
    if isinstance(value, dict):
        return sum(tensors_in(v, seen) for v in value.values())
    if isinstance(value, (list, tuple, set)):
        return sum(tensors_in(v, seen) for v in value)
    return 0


def both_ways(scenario: str, backend: str, **request):
    base = RunRequest("tiny-llama3-eagle", scenario, MODES, backend, bisect=False, **request)
    return (run_session(dataclasses.replace(base, jobs=2)), run_session(dataclasses.replace(base, jobs=1)))


@pytest.mark.costly
def test_five_modes_concurrently_equal_one_after_another_bit_for_bit(tmp_path):
    concurrent, sequential = both_ways(tiny_scenario(tmp_path), "emulated")
    assert_same_runs(concurrent, sequential)
    assert tensors_in(concurrent.runs.all_runs()) == 0
    said = concurrent.summary["measured"]["concurrency"]
    assert said["concurrent"] and said["jobs"] == 2 and "shared memory" in said["reason"]
    assert sequential.summary["measured"]["concurrency"]["reason"] == "sequential (--jobs 1)"
    path = said["critical_path"]
    assert set(path["spans"]) == set(concurrent.runs.all_runs()) and path["bounded_by"] == path["path"][-1]
    assert sequential.summary["measured"]["concurrency"]["critical_path"]["concurrency"] == 1.0


@pytest.mark.gpu
def test_five_modes_concurrently_equal_one_after_another_on_cuda(tmp_path):
    concurrent, sequential = both_ways(tiny_scenario(tmp_path), "cuda", dtype="bfloat16")
    assert_same_runs(concurrent, sequential)
    said = concurrent.summary["measured"]["concurrency"]
    assert said["concurrent"] and "CUDA IPC" in said["reason"]
    # NOTE: the device's peak is reported, not asserted against the plan here: make test-gpu's other xdist
    # workers share the GPU and its used memory (`scripts/concurrency_check.py` compares them on a quiet GPU).
    assert said["device"]["used_peak_bytes"] >= said["device"]["used_before_bytes"] > 0
    for name, memory in concurrent.summary["measured"]["memory"].items():
        assert memory["leftover_bytes"] == 0 and memory["shared_weights_bytes"] > 0, name


def plan(weights: int, budget: int, sizes: dict[str, int], probes: dict[str, int] | None = None):
    modes = {m: SimpleNamespace(run_bytes=b) for m, b in sizes.items()}
    probes = probes or {}
    return SimpleNamespace(weights=weights, budget=budget, budget_source="test", modes=modes,
                           reference_run=lambda mode: sizes["eager"] + probes.get(mode, 0))


SIZES = {"eager": 2 * GIB, "piecewise": 3 * GIB, "full": 3 * GIB}
REFS = {"piecewise": "ref:piecewise", "full": "ref:full"}


def test_width_and_why():
    cuda = torch.device("cuda")
    jobs = session_jobs(tuple(SIZES), REFS, plan(0, 0, SIZES))
    assert [j.name for j in jobs] == ["eager", "ref:piecewise", "ref:full", "piecewise", "full"]
    assert [j.bytes for j in jobs] == [2 * GIB] * 3 + [3 * GIB] * 2    # a reference without a probe: as eager
    probed = session_jobs(tuple(SIZES), REFS, plan(0, 0, SIZES, {"piecewise": GIB}))
    assert [j.bytes for j in probed][:3] == [2 * GIB, 3 * GIB, 2 * GIB], "eager's run plus the padding probe"
    roomy = plan(16 * GIB, 80 * GIB, SIZES)
    assert decide(roomy, 1, jobs, cuda).reason == "sequential (--jobs 1)"
    assert decide(roomy, None, jobs, torch.device("cpu")).jobs == 1
    assert decide(None, 4, jobs, cuda).reason.startswith("sequential: no memory plan")
    assert decide(roomy, 4, jobs, cuda).jobs == 4
    assert decide(roomy, None, jobs, cuda).jobs == min(5, AUTO_MAX, cpu_count())
    small = decide(plan(GIB // 2, 80 * GIB, SIZES), None, jobs, cuda)      # a tiny pair: its runs are short
    assert small.jobs == 1 and small.reason.startswith("sequential: the default for a pair under 1 GiB")
    assert decide(plan(GIB // 2, 80 * GIB, SIZES), 2, jobs, cuda).jobs == 2
    # Room for the weights, three workers and the three smallest runs, not four of each.
    three = 16 * GIB + 3 * WORKER_OVERHEAD["cuda"] + 6 * GIB
    assert decide(plan(16 * GIB, three, SIZES), 5, jobs, cuda).jobs == 3
    one = decide(plan(16 * GIB, 19 * GIB, SIZES), 5, jobs, cuda)
    assert (one.jobs, one.reason.startswith("sequential: two runs at once do not fit")) == (1, True)

    class Local(Records):      # a class made at run time: a spawned worker cannot import it
        pass
    unsendable = decide(roomy, 4, jobs, cuda, EngineParts(records=Local))
    assert unsendable.jobs == 1 and "cannot be sent to a worker process" in unsendable.reason


def test_a_run_waits_for_room_and_runs_alone_when_nothing_is_in_flight():
    concurrency = Concurrency(2, 2, "test", weights=0, budget=5 * GIB, overhead=0)
    big, small = Job("full", "full", False, 4 * GIB), Job("eager", "eager", False, 2 * GIB)
    state = _Schedule(concurrency, [big, small], scenario_requests=1)
    assert state._next() is big                      # nothing in flight
    state.pending.remove(big)
    state.running["full"] = big
    assert state._next() is None                     # 4 + 2 GiB do not fit 5
    state.pending.append(Job("tiny", "tiny", False, GIB))
    assert state._next().name == "tiny"              # the first job that fits beside the one in flight


class _Pipe:
    def __init__(self):
        self.sent, self.reply = [], None

    def send(self, message):
        self.sent.append(message)

    def recv(self):
        return self.reply


def _worker(index: int):
    return SimpleNamespace(index=index, ready=True, job=None, conn=_Pipe())


def _reply(state, worker, *message) -> None:
    worker.conn.reply = message
    state.receive(worker, None, None, 0)


def test_a_run_out_of_memory_beside_others_runs_again_alone():
    from parity.errors import OutOfDeviceMemory

    concurrency = Concurrency(3, 3, "test", weights=0, budget=10 * GIB, overhead=0)
    jobs = [Job(name, name, False, GIB) for name in ("eager", "full", "piecewise", "ref:full")]
    state = _Schedule(concurrency, jobs, scenario_requests=1)
    workers = [_worker(i) for i in range(3)]
    state.dispatch(workers, None)
    assert list(state.running) == ["eager", "full", "piecewise"]
    _reply(state, workers[1], "failed", "full", OutOfDeviceMemory("out of device memory in full"))
    assert [j.name for j in state.pending] == ["full", "ref:full"] and workers[1].job is None
    state.dispatch(workers, None)
    assert list(state.running) == ["eager", "piecewise"], "nothing starts while the retried run waits"
    _reply(state, workers[0], "done", "eager", SimpleNamespace(memory=None))
    assert state._next() is None                       # piecewise is still in flight
    _reply(state, workers[2], "done", "piecewise", SimpleNamespace(memory=None))
    state.dispatch(workers, None)
    assert list(state.running) == ["full"], "the retried run runs alone"
    _reply(state, workers[0], "done", "full", SimpleNamespace(memory=None))
    state.dispatch(workers, None)
    assert list(state.running) == ["ref:full"] and state.retried == ["full"]
    # out of memory again, or with nothing beside it, the run fails as it would have in one process
    with pytest.raises(OutOfDeviceMemory):
        _reply(state, workers[1], "failed", "ref:full", OutOfDeviceMemory("out of device memory in ref:full"))


def test_critical_path_of_known_spans():
    spans = {"eager": (10.0, 40.0), "ref:full": (10.0, 20.0), "full": (20.01, 30.0), "piecewise": (30.02, 45.0)}
    path = critical_path(spans, origin=9.0)
    assert path["bounded_by"] == "piecewise"
    assert path["path"] == ["ref:full", "full", "piecewise"]
    assert (path["runs_start_seconds"], path["runs_end_seconds"], path["runs_wall_seconds"]) == (1.0, 36.0, 35.0)
    assert path["concurrency"] == round((30 + 10 + 9.99 + 14.98) / 35, 2)
    assert critical_path({}, 0.0) is None


def test_jobs_must_be_a_positive_count(capsys):
    assert main(["run", "--jobs", "0"]) == 2
    err = capsys.readouterr().err
    assert "--jobs" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_context_no_worker_can_receive_runs_the_session_here(tmp_path):
    """A pool that says its workers cannot receive the context (`NotSendable`): every run happens in this process,
    and the run set says why."""
    from parity.harness.modes import run_modes
    from parity.harness.run_context import NotSendable
    from parity.harness.scenario import load_scenario
    from parity.models.pair import load_pair

    class Refusing:
        concurrency = Concurrency(2, 2, "test")

        def run(self, context, progress, on_run):
            raise NotSendable("the tokenizer cannot be sent to a worker process")
    scenario = dataclasses.replace(load_scenario(tiny_scenario(tmp_path)), max_tokens=2)
    runs = run_modes(load_pair("tiny-llama3-eagle"), scenario, ("eager",), "emulated", torch.device("cpu"),
                     pool=Refusing())
    assert runs.runs["eager"].result is not None and set(runs.spans) == {"eager"}
    assert runs.concurrency["reason"] == "sequential: the tokenizer cannot be sent to a worker process"


def test_parts_with_injected_faults_reach_a_worker_as_the_same_classes():
    """A run with `--inject` stays concurrent: the stacked fault classes pickle as the call that makes them, so a
    fresh process (here: the stacking cache cleared) rebuilds each with its name and method order."""
    import pickle

    from parity.faults import seam
    from parity.harness.workers import sendable
    everything = [seam.apply([name]) for name in seam.MUTATIONS] + [seam.apply(["stale-slot-mapping",
                                                                                "reassign-seq-lens"])]
    assert sendable(*everything) is None
    data = pickle.dumps(everything)
    seam._stack.cache_clear()
    for (parts, policy), (sent_parts, sent_policy) in zip(everything, pickle.loads(data)):
        for before, after in zip([*parts.roles().values(), policy.executor],
                                 [*sent_parts.roles().values(), sent_policy.executor]):
            assert [c.__qualname__ for c in after.__mro__] == [c.__qualname__ for c in before.__mro__]


def test_the_line_says_how_the_runs_went():
    from parity.report.bench import concurrency_line

    spans = {"eager": (1.0, 40.0), "full": (1.0, 20.0), "ref:full": (20.0, 45.0)}
    block = {"reason": "concurrent: up to 2 runs at once in worker processes sharing the weights through CUDA IPC",
             "critical_path": critical_path(spans, origin=0.0),
             "device": {"peak_bytes": 20 * GIB}, "planned_peak_bytes": 22 * GIB}
    line = concurrency_line(block)
    assert "bounded by ref:full (critical path full -> ref:full)" in line
    assert "concurrency 1.89 (83.0 s of runs in 44.0 s)" in line and "vs plan 22.00 GiB" in line
    assert concurrency_line(None) is None
    again = concurrency_line({**block, "retried_alone": ["ref:full"]})
    assert "ref:full ran out of device memory beside other runs and ran again alone" in again
