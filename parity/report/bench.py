"""Renderers of `parity bench` figures: real-shape forwards, a run's breakdown, clean-engine false alarms, audit cost.

Plain dicts in (what the harness measured), rich tables out; nothing computed
but units.
"""

from __future__ import annotations

from rich.table import Table

from parity.report.memory import human


def forwards_table(figures: dict) -> Table:
    """Per phase and batch: eager and FULL ms, speedup, kernels, replay over GPU time, the weight-read floor."""
    table = Table(title=f"forwards at max_model_len {figures['max_model_len']} · HBM copy "
                        f"{figures['bandwidth_gb_s']} GB/s · median of {figures['iters']}", title_justify="left")
    for column in ("phase", "batch", "eager ms", "full ms", "x", "kernels", "gpu ms", "replay/gpu", "floor ms",
                   "full/floor", "queued ms", "queued/floor"):
        table.add_column(column, justify="left" if column == "phase" else "right", no_wrap=True)
    for r in figures["forwards"]:
        kernels = f"{r['kernels']}" + ("" if r["kernels_seen_in_replay"] else "*")
        table.add_row(r["phase"], str(r["batch"]), f"{r['eager_ms']:.2f}", f"{r['full_ms']:.2f}",
                      f"{r['speedup']:.1f}", kernels, f"{r['gpu_ms']:.2f}", f"{r['replay_over_gpu']:.2f}",
                      f"{r['floor_ms']:.2f}", f"{r['full_over_floor']:.2f}", f"{r['queued_ms']:.2f}",
                      f"{r['queued_over_floor']:.2f}")
    table.caption = ("kernels*: counted on the forward run eagerly at the graph's padded shape (the profiler saw no "
                     "kernel inside the replay); floor: the weights the graph read (its capture manifest) / copy "
                     "bandwidth; full: one replay between two syncs; queued: replays issued back to back, as a "
                     "pipelined engine issues them")
    table.caption_justify = "left"
    return table


def run_table(run: dict) -> Table:
    """A whole run, run by run: capture and run seconds, peak and leftover memory, the plan's figure."""
    wall = f" · wall {run['wall_seconds']:.1f} s" if run.get("wall_seconds") else ""
    table = Table(title=f"{run['model']} / {run['scenario']} · {run['verdict']}{wall} · load "
                        f"{run['load_seconds']} s · analysis {run['analysis_seconds']} s · bisection "
                        f"{run['bisect_seconds']} s", title_justify="left")
    for column in ("run", "start s", "end s", "capture s", "run s", "peak", "peak reserved", "leftover", "plan",
                   "verdict", "len"):
        table.add_column(column, justify="left" if column == "run" else "right", no_wrap=True)
    for name, r in run["runs"].items():
        table.add_row(name, _seconds(r.get("start_seconds")), _seconds(r.get("end_seconds")),
                      f"{r.get('capture_seconds', 0):.2f}", f"{r.get('run_seconds', 0):.2f}",
                      human(r.get("peak_bytes")), human(r.get("peak_reserved_bytes")), human(r.get("leftover_bytes")),
                      human(r.get("plan_bytes")), r.get("verdict") or "-",
                      f"{r['mean_acceptance_length']:.3f}" if r.get("mean_acceptance_length") is not None else "-")
    table.caption = concurrency_line(run.get("concurrency"))
    table.caption_justify = "left"
    return table


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def concurrency_line(concurrency: dict | None) -> str | None:
    """How the runs went (at once or one after another, and why), which run bounded the wall time, the chain of
    runs it waited on, the concurrency achieved and, for concurrent runs on CUDA, the device's peak vs the plan."""
    if not concurrency:
        return None
    text = concurrency["reason"]
    path = concurrency.get("critical_path")
    if path:
        text += (f"; runs {path['runs_start_seconds']:.1f}-{path['runs_end_seconds']:.1f} s, bounded by "
                 f"{path['bounded_by']} (critical path {' -> '.join(path['path'])}); concurrency "
                 f"{path['concurrency']:.2f} ({path['busy_seconds']:.1f} s of runs in "
                 f"{path['runs_wall_seconds']:.1f} s)")
    if concurrency.get("mps") and concurrency.get("concurrent"):
        text += "; sharing the GPU through " + ("a private MPS daemon" if concurrency["mps"] == "private" else
                                                "the user's MPS daemon")
    retried = concurrency.get("retried_alone")
    if retried:
        text += f"; {', '.join(retried)} ran out of device memory beside other runs and ran again alone"
    device = concurrency.get("device")
    if device:
        text += (f"; device peak {human(device['peak_bytes'])} (weights + every worker) vs plan "
                 f"{human(concurrency.get('planned_peak_bytes'))}")
    return text


def alarms_line(result: dict) -> str:
    """One line: false alarms over mode runs, and the numerics the verdicts were not fooled by."""
    seam = f"padding numerics x{result['scale']:g}" if result["scale"] else "real padding numerics only"
    return (f"clean-engine false alarms ({result.get('model', 'tiny-llama3-eagle')}, {result['dtype']}, {seam}, "
            f"{result['seeds']} "
            f"seed(s) x {len(result['scenarios'])} scenarios x 4 graph modes, {result['requests']} requests x "
            f"{result['max_tokens']} tokens, {result['backend']}): {result['false_alarms']}/{result['mode_runs']}; "
            f"numerics seen: max |d logprob| {result['max_abs_logprob_diff']:.3g}, {result['token_flips']} token "
            f"flips, {result['draft_flips']} draft flips, {result['near_ties']} at a near tie")


def audit_line(result: dict) -> str:
    ms, over = result["replay_ms"], result["overhead"]
    return (f"parity.audit overhead ({result['backend']}, {result['device']}, median of {result['iterations']}): "
            f"plain replay {ms['plain']:.3f} ms; checked every replay {over['every_1']:.2f}x, every 16th "
            f"{over['every_16']:.2f}x")
