"""Runs kernel launches: static checks, then every block on its own scheduler,
then the cost model's kernel time. Blocks of one launch are unordered on real
hardware; here each runs to completion in turn (deterministically)."""
import itertools
import math
import os
import sys
import time

import numpy as np

from pallas_sim import gpus
from pallas_sim.backends.sim import refview, resources
from pallas_sim.backends.sim import rules  # noqa: F401  (registers all rules)
from pallas_sim.backends.sim.interpret import Compiler, run_gen
from pallas_sim.backends.sim.machine import memory, races
from pallas_sim.backends.sim.machine.state import BlockState, ThreadCtx
from pallas_sim.backends.sim.report import KernelReport, Report
from pallas_sim.errors import RaceError, UnsupportedPrimitiveError

CUDA_RESERVED_SMEM_PER_BLOCK = 1024


class Progress:
  """A progress line on a terminal for simulations longer than a few
  seconds; silent when stderr is not a TTY or under CI."""

  def __init__(self, name, total, after_s=2.0):
    self.name, self.total, self.after = name, total, after_s
    self.t0 = time.perf_counter()
    self.on = sys.stderr.isatty() and not os.environ.get("CI")
    self.shown = False

  def update(self, done):
    if not self.on:
      return
    el = time.perf_counter() - self.t0
    if el < self.after:
      return
    self.shown = True
    frac = done / self.total
    bar = "#" * int(30 * frac)
    sys.stderr.write(f"\r[pallas-sim] {self.name}: [{bar:<30}] {done}/{self.total} "
                     f"blocks {el:.1f}s")
    sys.stderr.flush()

  def close(self):
    if self.shown:
      sys.stderr.write("\n")


class Executor:
  """Receives launches from capture; accumulates a Report."""

  def __init__(self, gpu="h100", trace_blocks=2, check_races=True,
               on_race="raise", check_lowering=True):
    if on_race not in ("raise", "report"):
      raise ValueError(f"on_race={on_race!r}: choose 'raise' or 'report'")
    self.gpu = gpus.get(gpu)
    self.report = Report(self.gpu.name)
    self.trace_blocks = trace_blocks
    self.check_races = check_races
    self.on_race = on_race
    self.check_lowering_on = check_lowering
    self.errors = []
    self._prepared = {}
    self._lowered = {}

  def record_error(self, e):
    self.errors.append(e)

  def prepare(self, launch):
    """Checks that need no data, before anything runs: shared memory against
    the limit, and every primitive modelled. Returns (program, smem bytes)."""
    key = id(launch.jaxpr)
    hit = self._prepared.get(key)
    if hit is not None and hit[0] is launch.jaxpr:
      return hit[1]
    if math.prod(launch.cluster or (1,)) > 1:
      raise UnsupportedPrimitiveError(
          f"kernel {launch.name}: clusters {launch.cluster} are not modelled yet",
          where=launch.where)
    if any(not bm.has_trivial_window() for bm in launch.block_mappings):
      raise UnsupportedPrimitiveError(
          f"kernel {launch.name}: pallas_call BlockSpecs with index maps are not "
          "modelled (jax 0.11.2 cannot lower them for Mosaic GPU either); use "
          "plgpu.kernel with emit_pipeline", where=launch.where)
    jaxpr = launch.jaxpr
    extra = len(jaxpr.invars) - launch.num_inputs - launch.num_outputs
    if extra:
      raise UnsupportedPrimitiveError(
          f"kernel {launch.name}: {extra} kernel-level scratch operands "
          "(pallas_call scratch_shapes) are not modelled", where=launch.where)
    smem = resources.smem_bytes(jaxpr)
    resources.check_smem(smem, self.gpu, where=launch.where)
    prog = Compiler(self.gpu, launch).compile(jaxpr)
    self._prepared[key] = (jaxpr, (prog, smem))
    return prog, smem

  def check_lowering(self, launch, lower):
    """Raises what JAX's real Mosaic GPU lowering raises for this kernel, as
    our own error class, so that nothing the hardware backend rejects runs
    here. Once per kernel."""
    if not self.check_lowering_on:
      return
    key = id(launch.jaxpr)
    if self._lowered.get(key) is launch.jaxpr:  # (ids are reused: compare)
      return
    err = lower()  # (exception, its user file:line or None) or None
    if err is not None:
      raise resources.lowering_error(err[0], where=err[1] or launch.where)
    self._lowered[key] = launch.jaxpr

  def execute(self, launch, arrays):
    with np.errstate(all="ignore"):
      return self._execute(launch, arrays)

  def _execute(self, launch, arrays):
    gpu = self.gpu
    prog, smem = self.prepare(launch)
    n_in, n_out = launch.num_inputs, launch.num_outputs
    names = list(launch.arg_names[:n_in + n_out])
    if len(names) < n_in + n_out:
      names = [f"in{i}" for i in range(n_in)] + [f"out{j}" for j in range(n_out)]
    in_bufs = [memory.Buffer(names[i], "gmem", np.array(a, copy=True))
               for i, a in enumerate(arrays[:n_in])]
    aliases = dict((o, i) for i, o in launch.aliases)
    out_bufs = []
    for j, aval in enumerate(launch.out_avals):
      if j in aliases:
        out_bufs.append(in_bufs[aliases[j]])
      else:
        out_bufs.append(memory.Buffer(names[n_in + j], "gmem",
                                      memory.poison(aval.shape, aval.dtype)))
    gmem_refs = [refview.root_ref(b) for b in in_bufs + out_bufs]

    grid = tuple(launch.grid) or ()
    grid_names = tuple(launch.grid_names)
    nt = launch.num_threads
    blocks = list(itertools.product(*[range(g) for g in grid]))
    cycles = np.empty(len(blocks))
    stats = dict(tma_load_bytes=0, tma_store_bytes=0, wgmma_flops=0)
    trace = []
    progress = Progress(launch.name, len(blocks))
    tracker = races.Tracker(launch.name, nt) if self.check_races else None
    t0 = time.perf_counter()
    for bi, idx in enumerate(blocks):
      blk = BlockState(idx, gpu, trace if bi < self.trace_blocks else None,
                       tracker, nt)
      if tracker is not None:
        tracker.block, tracker.block_id = idx, bi + 1
      axes = {}
      for d, (i, g) in enumerate(zip(idx, grid)):
        if d < len(grid_names):
          axes[grid_names[d]] = (i, g)
        axes[("grid", d)] = (i, g)
      for tid in range(nt):
        t_axes = dict(axes)
        if launch.thread_name is not None:
          t_axes[launch.thread_name] = (tid, nt)
        label = f"block {idx}" + (f" thread {tid}" if nt > 1 else "")
        t = ThreadCtx(blk, tid, t_axes, label)
        blk.sched.spawn(t, self._thread(prog, gmem_refs, t, launch))
      cycles[bi] = blk.sched.run()
      if tracker is not None:
        tracker.end_block(blk)
      st = blk.stats
      stats["tma_load_bytes"] += st.tma_load_bytes
      stats["tma_store_bytes"] += st.tma_store_bytes
      stats["wgmma_flops"] += st.wgmma_flops
      if bi & 63 == 63:
        progress.update(bi + 1)
    progress.close()
    wall = time.perf_counter() - t0

    if tracker is not None:
      found = tracker.log.races()
      self.report.races.extend(found)
      if found and self.on_race == "raise":
        self.record_error(RaceError(
            f"{len(found)} race(s) in kernel {launch.name}:\n"
            + "\n".join(str(r) for r in found), races=found, where=launch.where))

    per_sm, waves, seconds = self._kernel_time(cycles, smem, nt, stats, arrays,
                                               launch.out_avals)
    self.report.kernels.append(KernelReport(
        name=launch.name, where=launch.where, grid=grid, num_threads=nt,
        num_blocks=len(blocks), smem_bytes=smem, blocks_per_sm=per_sm,
        waves=waves, block_cycles_min=float(cycles.min(initial=0)),
        block_cycles_mean=float(cycles.mean()) if len(cycles) else 0.0,
        block_cycles_max=float(cycles.max(initial=0)), time_s=seconds,
        wall_s=wall, clock_hz=gpu.clock_hz, trace=trace, **stats))
    return [b.data for b in out_bufs]

  def _thread(self, prog, refs, t, launch):
    """A thread's coroutine; with race detection, it also reports TMA stores
    whose SMEM reads it never awaited: the lowering does not wait for them
    at the end (jax 0.11.2 awaits only in wait_smem_to_gmem), and the SMEM
    they read may be freed. (Their GMEM writes still land: seen on an H200,
    benchmarks/gpu_probes.py, so an unawaited write side is not reported.)"""
    yield from run_gen(prog, refs, t)
    if t.vc is not None and (t.open_group or
                             t.vc[t.sr_comp] < t.base + t.store_groups):
      site = t.site("thread", "end of kernel", launch.where, "TMA stores", "end")
      t.block.tracker.misuse(
          "unawaited TMA store", site, t.block.index,
          f"thread {t.tid} ends with TMA stores still reading SMEM: "
          "wait_smem_to_gmem(0) before the kernel ends")

  def _kernel_time(self, cycles, smem, nt, stats, arrays, out_avals):
    """Blocks fill SMs by occupancy; each SM runs its blocks' cycles (shared
    engines: no overlap credit between co-resident blocks); the kernel also
    cannot beat HBM bandwidth for the bytes it moves (calibrate)."""
    gpu = self.gpu
    by_smem = gpu.smem_per_sm // (smem + CUDA_RESERVED_SMEM_PER_BLOCK)
    by_threads = gpu.max_threads_per_sm // (128 * nt)
    per_sm = max(1, min(by_smem, by_threads, 32))
    n = len(cycles)
    waves = -(-n // (gpu.num_sms * per_sm)) if n else 0
    sm_cycles = np.zeros(gpu.num_sms)
    for i, c in enumerate(cycles):
      sm_cycles[i % gpu.num_sms] += c / per_sm
    compute_s = sm_cycles.max(initial=0) / gpu.clock_hz
    traffic = stats["tma_load_bytes"] + stats["tma_store_bytes"]
    if not traffic:  # kernels without TMA move their operands with plain ld/st
      traffic = sum(np.asarray(a).nbytes for a in arrays) + sum(
          math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in out_avals)
    memory_s = traffic / gpu.hbm_bytes_per_s
    return per_sm, waves, max(compute_s, memory_s) + gpu.launch_overhead_s
