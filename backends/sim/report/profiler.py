"""Mosaic GPU's on-device profiler, on the simulator:
`plgpu.CompilerParams(profile_space=N, profile_dir=D)` writes a Chrome trace
of the kernel's `jax.named_scope` ranges, one track per warpgroup (or per
warp with `profile_trace_scope=WARP`), timed by the simulated clock.

As the lowering (pallas/mosaic_gpu/lowering.py, `lower_jaxpr_to_mosaic_gpu`):
each jaxpr lowered (the kernel body, a branch, a loop body) opens and closes
regions where consecutive equations' name stacks differ, and closes what is
left open at its end. As the profiler (mosaic/gpu/profiler.py): each trace
holds `profile_space * 4` 32-bit entries, 3 of them a header and 2 per
event; `profile_bounds_check` drops the events past that (the dump then
closes the ranges left open), and without it an overflow is an error here
(on the GPU it corrupts the SMEM next to the buffer). The buffer takes SMEM:
4 bytes per entry per trace. The file has the profiler's name and format,
and its unit: the SM's cycles written as nanoseconds, so that a range's
length is its cycles on either backend (lab/pipeline_trace.py reads
both). The GPU's profiler reads %clock, counts from each trace's first
event less an estimate of its own cost per event, and adds the block's
start on the global timer; here each block's cycles count from its start
(0), and the profiler costs nothing.
"""
import dataclasses
import json
import os
import time
from collections.abc import Sequence

from pallas_sim.errors import KernelError
from pallas_sim.backends.sim.base import jax_internals as jx

HEADER_ENTRIES = 3
WARPS = 4


@dataclasses.dataclass(frozen=True)
class Spec:
  space: int            # profile_space: ranges per trace
  directory: str
  per_warp: bool        # profile_trace_scope == WARP
  bounds_check: bool

  @property
  def entries(self):
    return self.space * 2 * 2

  def traces(self, num_threads):
    return num_threads * (WARPS if self.per_warp else 1)

  def smem_bytes(self, num_threads):
    return self.traces(num_threads) * self.entries * 4


def spec_of(compiler_params):
  """The profiler's Spec from a kernel's compiler params, or None."""
  if isinstance(compiler_params, dict):
    compiler_params = compiler_params.get("mosaic_gpu")
  space = getattr(compiler_params, "profile_space", 0)
  if not space:
    return None
  return Spec(space, compiler_params.profile_dir,
              compiler_params.profile_trace_scope == jx.gpu_core.TraceScope.WARP,
              bool(compiler_params.profile_bounds_check))


def without_profiler(compiler_params):
  """The same params with the profiler off (what the lowering check gets:
  the profiler only instruments the kernel, and its dump is a host callback
  that a CPU cannot lower for CUDA)."""
  if isinstance(compiler_params, dict):
    return {k: without_profiler(v) for k, v in compiler_params.items()}
  if getattr(compiler_params, "profile_space", 0):
    return dataclasses.replace(compiler_params, profile_space=0, profile_dir="")
  return compiler_params


def scope_changes(names_before: Sequence[str], names: Sequence[str]
                  ) -> tuple[int, Sequence[str]]:
  """(how many regions to close, names of those to open) between two name
  stacks, as the lowering's _compute_name_stack_updates."""
  common = 0
  for a, b in zip(names_before, names):
    if a != b:
      break
    common += 1
  return len(names_before) - common, names[common:]


class Recorder:
  """The events of one launch: (block number, trace) -> [(name, begin, cycle)]."""

  def __init__(self, spec):
    self.spec = spec
    self.traces = {}

  def event(self, wg, name, begin):
    """A region of `wg` (a warpgroup, or a warp in a warp_map) opens or closes."""
    warp = getattr(wg, "warp", None)
    thread = wg.parent.index if warp is not None else wg.index
    n = WARPS if self.spec.per_warp else 1
    if not self.spec.per_warp:
      traces = [thread]
    elif warp is not None:
      traces = [thread * n + warp]
    else:
      traces = [thread * n + w for w in range(n)]
    for t in traces:
      self.traces.setdefault((wg.block.number, t), []).append((name, begin, wg.time))

  def dump(self, launch, num_sms):
    """Writes the trace file; returns its path."""
    spec = self.spec
    usable = (spec.entries - HEADER_ENTRIES) // 2
    per_block = spec.traces(launch.num_threads)
    events = []
    for (block, trace), evs in sorted(self.traces.items()):
      if len(evs) > usable:
        if not spec.bounds_check:
          raise KernelError(
              f"profiler: block {block} trace {trace} records {len(evs)} events, but "
              f"profile_space={spec.space} holds {usable}: on the GPU this overflows "
              "into the SMEM next to the buffer (set profile_bounds_check=True to "
              "truncate, or raise profile_space)",
              where=getattr(launch, "where", None))
        evs = evs[:usable]
      out, stack, last = [], [], None
      for name, begin, cycle in evs:
        # (as the GPU's profiler: the SM's cycle counter read as nanoseconds,
        # in microseconds, from the block's start)
        ts = cycle / 1e3
        out.append({"name": name, "ph": "B" if begin else "E", "ts": ts,
                    "pid": 1 + block % num_sms, "tid": 1 + trace + per_block * block})
        if begin:
          stack.append(out[-1])
        elif stack:
          stack.pop()
        last = ts
      for ev in reversed(stack):  # (closes what truncation left open)
        out.append({**ev, "ph": "E", "ts": last})
      if out:
        events.append(out)
    events.sort(key=lambda evs: evs[0]["ts"])
    os.makedirs(spec.directory, exist_ok=True)
    path = os.path.join(spec.directory,
                        f"{jx.mlir.sanitize_name(launch.name)}-{time.time_ns()}-trace.json")
    with open(path, "x") as f:
      json.dump({"displayTimeUnit": "ns",
                 "traceEvents": [e for evs in events for e in evs]}, f)
    return path
