"""Barriers and fences: barrier_arrive, barrier_wait, commit_smem,
set_max_registers. A barrier_wait by a thread waits for the next completion
of that barrier it has not yet observed (the phase it tracks)."""
from pallas_sim.backends.sim import refview
from pallas_sim.backends.sim.interpret import Gen, rule
from pallas_sim.backends.sim.machine import barriers
from pallas_sim.backends.sim.machine.scheduler import Wait


@rule("barrier_arrive")
def _barrier_arrive(eqn, cx):
  at = refview.compile_transforms(eqn.params["transforms_treedef"])
  has_pred = eqn.params.get("has_user_predicate", False)

  def arrive(t, ref, *rest):
    if has_pred:
      *rest, pred = rest
      if not pred:
        return []
    slot = refview.barrier_of(at(ref, rest), "barrier_arrive")
    if t.vc is None:
      barriers.arrive(slot, t.block.sched)
    else:
      t.block.barrier_comp(slot)
      barriers.arrive(slot, t.block.sched, vecs=(t.vc, t.avc))
      t.tick()
    return []
  return arrive


@rule("barrier_wait")
def _barrier_wait(eqn, cx):
  at = refview.compile_transforms(eqn.params["transforms_treedef"])
  where = cx.where(eqn)
  lat = cx.gpu.barrier_latency

  def wait(t, ref, *leaves):
    slot = refview.barrier_of(at(ref, leaves), "barrier_wait")
    key = id(slot)
    n = t.bar_waits.get(key, 0) + 1
    t.bar_waits[key] = n
    if t.vc is not None:
      t.block.barrier_comp(slot)
      if t.tid not in slot.waits:  # a waiter from now on
        slot.waits[t.tid] = [n - 1, 0, where]
    if t.vc is not None and slot.completions > n:
      # mbarrier waits are by phase parity: completion #n+1 already happened,
      # so the hardware would take this wait for completion #n+2.
      slot.misuse(
          t.tid, where,
          f"barrier {slot.name} completed {slot.completions} times before "
          f"thread {t.tid}'s wait #{n} for completion #{n}: waits go by phase "
          "parity, so on hardware this wait would wait for a later completion; "
          "each completion must be observed by one wait of each waiting thread "
          "before the next one")
    if slot.completions < n:
      start = t.time
      yield Wait(lambda: slot.completions >= n, (slot,),
                 f"barrier_wait on {slot.name} (completion #{n})", where)
      t.block.event(t.name, f"wait {slot.name}", start, t.time)
    if t.vc is not None:
      t.join(*slot.phases[n - 1])
      slot.waits[t.tid] = [n, int(t.vc[t.comp]), where]
      t.tick()
    t.time += lat
    return []
  return Gen(wait)


@rule("commit_smem")
def _commit_smem(eqn, cx):
  # Async-proxy fence + warpgroup barrier: no effect on values (plain stores
  # are immediate); for race detection, it publishes this thread's plain SMEM
  # accesses so far to the async work it issues next.
  def commit(t):
    if t.vc is not None:
      t.commit()
    return []
  return commit


@rule("set_max_registers_p", "set_max_registers")
def _set_max_registers(eqn, cx):
  return lambda t: []
