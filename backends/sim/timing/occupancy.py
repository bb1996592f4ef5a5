"""How many blocks an SM holds, and what a warpgroup keeps in registers.

Registers are estimated from the kernel's jaxpr, as a kernel author would:
a warpgroup's 128 lanes hold its wgmma accumulators (plgpu.ACC, f32: one
register per element per lane) and the arrays it computes on, plus a base
for addresses, indices and loop counters. An accumulator and the value read
out of it are the same registers, so the estimate is the base plus the
larger of the two, not their sum. Past the budget (255 per lane, the
register file's share of each warpgroup, or what plgpu.set_max_registers
asks for) the compiler spills to local memory: `spilled` lanes' registers,
which the timing model charges to every wgmma on that accumulator
(timing/model.py)."""
import dataclasses
import math

import numpy as np

from pallas_sim.backends.sim.analysis import resources, walker

LANES = 128                  # a warpgroup
REGISTER_FILE = 65536        # 32-bit registers per SM
MAX_PER_THREAD = 255
ALLOCATION_UNIT = 8          # registers per lane are allocated in eights


@dataclasses.dataclass(frozen=True)
class Registers:
  per_thread: int     # estimated need of a lane
  limit: int          # what a lane may have
  accumulators: int   # of the need: wgmma accumulators
  raised: int = 0     # what set_max_registers(action="increase") raises a lane to

  @property
  def spilled(self):
    return max(0, self.per_thread - self.limit)


def _is_acc(aval):
  return type(aval).__name__ == "WGMMAAbstractAccumulatorRef"


def _regs(aval):
  """Registers per lane that an array (or accumulator) of this aval takes."""
  shape = getattr(aval, "shape", ())
  dtype = getattr(aval, "dtype", None)
  if not shape or dtype is None or hasattr(aval, "inner_aval") and not _is_acc(aval):
    return 0
  nbytes = math.prod(shape) * np.dtype(dtype).itemsize
  return -(-nbytes // (4 * LANES))


def _need(jaxpr):
  """(accumulator registers, largest array value's registers) of a jaxpr:
  accumulators of nested scopes add up, scopes in sequence reuse theirs."""
  acc = values = 0
  for eqn in jaxpr.eqns:
    own = sum(_regs(v.aval) for v in resources.scope_allocations(eqn) if _is_acc(v.aval))
    for v in eqn.outvars:
      if not hasattr(v.aval, "inner_aval"):
        values = max(values, _regs(v.aval))
    inner_acc = 0
    for sub in walker.bodies(eqn):
      a, val = _need(sub)
      inner_acc = max(inner_acc, a)
      values = max(values, val)
    acc = max(acc, own + inner_acc)
  return acc, values


def registers(jaxpr, num_threads, base):
  """A lane's register need and budget in a kernel of `num_threads`
  warpgroups (`base`: registers beyond its arrays, gpus.GPU)."""
  acc, values = _need(jaxpr)
  asked = resources.asked_registers(jaxpr)
  if asked:
    limit = min(max(asked.values()), MAX_PER_THREAD)
  else:
    share = REGISTER_FILE // (LANES * num_threads)
    limit = min(MAX_PER_THREAD, share // ALLOCATION_UNIT * ALLOCATION_UNIT)
  return Registers(base + max(acc, values), limit, acc, asked.get("increase", 0))


def l1_bytes(gpu, smem_per_sm):
  """The L1 an SM has beside smem_per_sm bytes of SMEM: the driver takes the
  smallest SMEM carve-out that holds them."""
  carve = min((c * 1024 for c in gpu.smem_carveouts_kib if c * 1024 >= smem_per_sm),
              default=gpu.smem_carveouts_kib[-1] * 1024)
  return gpu.l1_smem_bytes - carve


def blocks_per_sm(gpu, smem, num_threads, regs, reserved_smem):
  """Blocks one SM holds at once: by SMEM, threads and registers. A block
  whose warpgroups raise their registers (setmaxnreg.inc) draws the raise
  from its own allocation, made at launch. Which warpgroups raise and which
  lower is not read off the kernel: every lane counts at the raised count,
  a bound on what the block holds (attention_mgpu: two warpgroups at 232
  and one at 40 hold 64.5 K registers, too many for two blocks in the SM's
  64 K, one block an SM either way; the H200 ran its d64 kernel 31% slower
  with 64-column KV blocks than with 128, where the three blocks an SM that
  its ~56 estimated registers allow would have made it faster)."""
  by_smem = gpu.smem_per_sm // (smem + reserved_smem)
  by_threads = gpu.max_threads_per_sm // (LANES * num_threads)
  lane = max(min(regs.per_thread, regs.limit), regs.raised)
  lane = -(-lane // ALLOCATION_UNIT) * ALLOCATION_UNIT
  by_regs = REGISTER_FILE // (lane * LANES * num_threads)
  return max(1, min(by_smem, by_threads, by_regs, 32))
