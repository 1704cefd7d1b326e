"""`aiayn bench --profile`: where a training step's time goes, from torch.profiler over a few warm steps.

- **Launches per step**: on CUDA, the kernels (and memory copies/sets) the device ran; on a CPU, the ATen operators
  that did the work (leaf ops: `aten::linear` counts once, as the `aten::addmm` under it). A small model's step is
  launch-bound (about 375 launches for microseconds of arithmetic), so this count, not FLOPs, sets its pace.
- **Top kernels**: each kernel (CPU: leaf operator) by its own time per step, and its share of the step's total.
- **Device idle** (CUDA): the fraction of the span from the first kernel's start to the last one's end in which no
  kernel ran, the gaps the host's launches leave.

torch.profiler is the tool (no hand-written timers): it records each kernel's interval on the device as the device
ran it, which host-side timing cannot see.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
from torch.autograd import DeviceType

TOP = 8  # kernels listed


def idle_fraction(intervals: list[tuple[float, float]]) -> float:
    """The fraction of [first start, last end] that no interval covers (0 where they leave no gap)."""
    spans = sorted((float(a), float(b)) for a, b in intervals if b >= a)
    if not spans:
        return 0.0
    total = max(end for _, end in spans) - spans[0][0]
    if total <= 0:
        return 0.0
    busy, (start, end) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > end:
            busy += end - start
            start, end = a, b
        else:
            end = max(end, b)
    busy += end - start
    return max(0.0, 1.0 - busy / total)


def _work(events, device: torch.device) -> list:
    """The events that did the work: device kernels on CUDA; leaf ATen operators on a CPU."""
    if device.type == "cuda":
        return [e for e in events if e.device_type == DeviceType.CUDA]
    aten = [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::")]
    return [e for e in aten if not any(c.name.startswith("aten::") for c in e.cpu_children)]


def _own_us(event, device: torch.device) -> float:
    if device.type == "cuda":
        return float(event.time_range.end - event.time_range.start)
    return float(event.self_cpu_time_total)


def profile_steps(step: Callable[[], None], device: torch.device, steps: int) -> dict:
    """`steps` calls of `step` (warm already) under torch.profiler: launches per step, the top kernels by their own
    time per step and their share, and on CUDA the device's idle fraction over the steps."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    work = _work(prof.events(), device)
    by_name: dict[str, float] = defaultdict(float)
    for e in work:
        by_name[e.name] += _own_us(e, device)
    total = sum(by_name.values())
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:TOP]
    out = {
        "what": "CUDA kernels" if device.type == "cuda" else "leaf ATen operators",
        "steps": steps,
        "launches_per_step": len(work) / steps,
        "work_ms_per_step": total / steps / 1e3,
        "top": [
            {"name": name, "ms_per_step": us / steps / 1e3, "share": us / total if total else 0.0} for name, us in top
        ],
    }
    if device.type == "cuda":
        out["device_idle_fraction"] = idle_fraction([(e.time_range.start, e.time_range.end) for e in work])
    return out


def profile_text(impl: str, p: dict) -> str:
    """The profile as the bench prints it, under its table."""
    lines = [
        f"\nprofile of {impl}'s training step ({p['steps']} steps): {p['launches_per_step']:.0f} {p['what']} a "
        f"step, {p['work_ms_per_step']:.2f} ms of their own time a step"
        + (
            f"; the device idle {100 * p['device_idle_fraction']:.1f}% of the span between its first and last kernel"
            if "device_idle_fraction" in p
            else ""
        )
    ]
    lines += [f"  {100 * t['share']:5.1f}%  {t['ms_per_step']:8.3f} ms  {t['name'][:100]}" for t in p["top"]]
    return "\n".join(lines)
