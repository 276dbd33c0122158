"""Where a FULL forward's GPU time goes: `python -m parity.scripts.kernel_profile --synth-dir DIR`.

For a real-shape pair (the synthetic 8B pair of `parity models synth`, or any
local target/head pair) in bf16 on one GPU: the verify or drafter forward at
batch 1, 8 and 32 (uniform decode batches, max_model_len 512, as `parity bench
scale` times them) run once eagerly at the FULL graph's padded shape, which
launches the very kernels the replay does, under torch.profiler; the kernels
grouped by name, the largest groups first, with their share of the GPU time
(`--order`: every kernel in launch order with its time). Without CUDA it prints one line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path


def group_kernels(events, width: int = 90) -> list[tuple[str, int, float]]:
    """(name, count, microseconds) per kernel name (cut to `width`), the most time first.

    `events` are (name, microseconds) of the device-side events of one forward.
    """
    groups: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for name, micros in events:
        group = groups[name[:width]]
        group[0] += 1
        group[1] += micros
    return sorted(((name, n, us) for name, (n, us) in groups.items()), key=lambda g: -g[2])


def format_groups(title: str, groups: list[tuple[str, int, float]], top: int) -> str:
    total = sum(us for _, _, us in groups) or 1.0
    lines = [f"{title}: {sum(n for _, n, _ in groups)} kernels, {total / 1e3:.2f} ms"]
    lines += [f"{us / 1e3:8.3f} ms {100 * us / total:5.1f}% {n:6d}  {name}" for name, n, us in groups[:top]]
    return "\n".join(lines)


def format_order(title: str, events, width: int = 90) -> str:
    """Every kernel of one forward in launch order with its microseconds (what `--order` prints): where the
    small kernels sit between the large ones, which the groups by name do not show."""
    total = sum(us for _, us in events)
    lines = [f"{title}: {len(events)} kernels in launch order, {total / 1e3:.3f} ms"]
    return "\n".join(lines + [f"{us:8.2f} us  {name[:width]}" for name, us in events])


def profile_forward(pair, phase: str, batch: int, device) -> list[tuple[str, float]]:
    """The device events of one `phase` forward at `batch`, run eagerly at its FULL graph's padded shape."""
    import torch

    from parity.harness.bench import forward_engines, prepare_forward
    from parity.harness.bench_scale import device_events

    with forward_engines(pair, device, "cuda", ("full",), batch, 512, capture_sizes=(batch,)) as engines:
        forward = prepare_forward(engines["full"], phase, batch)
        with torch.no_grad():
            for _ in range(3):      # the allocator's and cuBLAS's first-call work stays out of the profile
                forward.eager_at_padded_shape()
        return device_events(forward.eager_at_padded_shape, device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity.scripts.kernel_profile", description=__doc__.splitlines()[0])
    p.add_argument("--synth-dir", default="/tmp/synth8b", help="a folder holding target/ and the head's folder")
    p.add_argument("--head", default="eagle1", help="the drafter's folder under --synth-dir (eagle1, eagle3, ...)")
    p.add_argument("--phases", default="verify", help="verify, draft_step, draft_prefill; comma-separated")
    p.add_argument("--batches", default="1,8,32", help="batch sizes, comma-separated")
    p.add_argument("--top", type=int, default=20, help="kernel groups shown per batch")
    p.add_argument("--order", action="store_true", help="every kernel in launch order instead of the groups")
    args = p.parse_args(argv)
    from parity.scripts.gpu_scale import cuda_problem

    problem = cuda_problem()
    if problem is not None:
        print(f"kernel_profile: needs one CUDA GPU: {problem}; nothing was run", file=sys.stderr)
        return 2
    import torch

    from parity.models.pair import load_pair

    root = Path(args.synth_dir)
    device = torch.device("cuda")
    pair = load_pair("local", target_path=str(root / "target"), draft_path=str(root / args.head),
                     dtype=torch.bfloat16, device=device)
    for phase in args.phases.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            events = profile_forward(pair, phase, batch, device)
            title = f"{phase} batch {batch}"
            print(format_order(title, events) if args.order else format_groups(title, group_kernels(events), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
