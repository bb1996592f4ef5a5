"""Warp-level code: `plgpu.warp_map` and `pl.kernel`/`core_map` over a
`plgpu.WarpMesh` inside a kernel, both an mpmd_map over a WarpMesh.

The lowering (mosaic_gpu/lowering.py, `_mpmd_map_lowering_rule`) runs the
body once per warp with single-warp semantics, between two warpgroup
barriers (Lane semantics; Warpgroup semantics isolates it in a warp_map
op): a fork and a join. Here each warp is a task of its own
(machine/state.py `Warp`), so warps that wait on each other (one issues a
copy, another waits on its barrier) run as they would on the GPU, and the
race detector gives each warp a clock of its own.
"""

from pallas_sim.backends.sim.analysis import walker
from pallas_sim.backends.sim.interpret.compiler import Gen, rule, run_gen
from pallas_sim.backends.sim.machine.scheduler import Resource, Wait
from pallas_sim.backends.sim.machine.state import WARPS_PER_WARPGROUP, Warp
from pallas_sim.errors import LoweringError, not_modelled
from pallas_sim.backends.sim.base import jax_internals as jx

DIVERGED = -1  # bar_waits: the warps waited on this barrier unequally


@rule("mpmd_map")
def _mpmd_map(eqn, cx):
  meshes, jaxprs = eqn.params["meshes"], walker.form_of(eqn, walker.Call).given
  where = cx.where(eqn)
  if len(jaxprs) != 1 or not isinstance(meshes[0], jx.gpu_core.WarpMesh):
    raise not_modelled(
        f"mpmd_map over {', '.join(type(m).__name__ for m in meshes)} inside a "
        "kernel: only a single WarpMesh (plgpu.warp_map) is modelled, as in the "
        "Mosaic GPU lowering")
  for v in eqn.invars:
    shape = getattr(v.aval, "shape", ())
    if shape and not hasattr(v.aval, "inner_aval"):  # (an array, not a Ref)
      msg = ("Can only close over scalars and Refs when using mpmd_map with "
             f"WarpMesh. Found array of shape {v.aval}.")
      # The lowering's own error class, so that code catching it works alike.
      raise LoweringError.of(jx.gpu_lowering.LoweringError(msg), msg)
  axis = meshes[0].axis_name
  body = cx.compile(jaxprs[0])
  n = WARPS_PER_WARPGROUP

  def warp_map(wg, *args):
    sched = wg.sched
    warps = [Warp(wg, w, {**wg.axes, axis: (w, n)}) for w in range(n)]
    wg.block.hb.fork(wg, warps)
    joined = Resource(f"{wg.name} warp_map")
    finished = []

    def run(warp):
      yield from run_gen(body, list(args), warp)
      finished.append(warp)
      sched.notify(joined, at=warp.time)

    for warp in warps:
      sched.spawn(warp, run(warp))
    if len(finished) < n:
      yield Wait(lambda: len(finished) == n, (joined,), "the end of warp_map", where)
    wg.time = max([wg.time] + [w.time for w in warps])
    wg.block.hb.join(wg, warps)
    # Barrier phases are per lane (mosaic's BarrierRef keeps parities in
    # each thread's registers): waits made inside the map count for the
    # warpgroup only where every warp made the same number; otherwise each
    # warp keeps its own count for the next warp_map (a warp that alone
    # waits on a barrier, map after map, agrees with itself), and a wait of
    # the whole warpgroup is an error. The warps stop being waiters (a later
    # completion cannot be lost on them).
    for slot in dict.fromkeys(s for w in warps for s in w.bar_waits):
      counts = [w.bar_waits.get(slot, 0) for w in warps]
      seen = [slot.waits.pop(w, None) for w in warps]
      if len(set(counts)) == 1:
        wg.bar_waits[slot] = counts[0]
        wg.warp_waits.pop(slot, None)
        if any(seen):
          slot.waits[wg] = [wg.bar_waits[slot], next(s for s in seen if s)[1]]
      else:
        wg.bar_waits[slot] = DIVERGED
        wg.warp_waits[slot] = counts
        slot.waits.pop(wg, None)
    return []
  return Gen(warp_map)
