"""Barriers and fences: barrier_arrive, barrier_wait, commit_smem,
set_max_registers. A barrier_wait by a warpgroup waits for the next
completion of that barrier it has not yet observed (the phase it tracks)."""
import numpy as np

from pallas_sim.backends.sim.interpret import operands
from pallas_sim.backends.sim.interpret import refview
from pallas_sim.backends.sim.interpret.compiler import Gen, rule
from pallas_sim.backends.sim.machine import barriers
from pallas_sim.backends.sim.machine.scheduler import Wait, catch_up
from pallas_sim.backends.sim.interpret.rules.refs import peer_buffer
from pallas_sim.errors import KernelError


def _barrier(eqn):
  """(the barrier's RefOperand, its transforms compiled, the predicate's
  position or None)."""
  ops = operands.barrier_use(eqn)
  return ops.barrier, refview.compile_transforms(ops.barrier.tree), ops.predicate


@rule("barrier_arrive")
def _barrier_arrive(eqn, cx):
  bar, at, pred_at = _barrier(eqn)
  where = cx.where(eqn)

  def arrive(wg, *args):
    if pred_at is not None and not args[pred_at]:
      return []
    slot = refview.barrier_of(at(args[bar.index], args[bar.leaves]), "barrier_arrive")
    blk = wg.block
    # A cluster barrier: one arrival on its copy in every block of the
    # cluster that differs from this one along at most one of its axes (or,
    # leader-tracked, in the leader's only: block 0 along its axis).
    for peer in (_arrivees(blk, slot) if slot.collective else (blk,)):
      s = slot if peer is blk else peer_slot(peer, slot)
      # (a ClusterBarrier's arrivals are one lane's per block arrived on)
      blk.hb.arrive(wg, s, where, one_lane=bool(slot.collective))
      barriers.arrive(s, at=wg.time)
    return []
  return arrive


def _arrivees(blk, slot):
  peers = blk.group.peers(blk, slot.collective, line=True)
  if slot.leader_tracked:
    (axis,) = slot.collective  # (the lowering allows one axis)
    d = blk.group.cluster_axes[axis][0]
    peers = [p for p in peers if p.cluster[d] == 0]
  return peers


def peer_slot(peer, slot):
  """`slot`'s counterpart in cluster peer `peer`'s SMEM."""
  return peer_buffer(peer, slot.owner).data.reshape(-1)[slot.key[1]]


def _next_completion(wg, slot, prim):
  """The completion of `slot` that `wg`'s next wait (or test) is for."""
  n = wg.bar_waits.get(slot, 0) + 1
  if n <= 0:  # (warps.DIVERGED)
    raise KernelError(
        f"{prim} on {slot.name} by thread {wg.index}: inside a warp_map its "
        "warps waited on this barrier different numbers of times, so its lanes "
        "disagree on the barrier's phase (each lane tracks its own)")
  return n


@rule("barrier_test")
def _barrier_test(eqn, cx):
  """A wait that does not block: whether the completion the thread's next
  wait is for has happened by now; if it has, it counts as observed (the
  lowering flips the thread's phase parity only then)."""
  bar, at, _ = _barrier(eqn)
  where = cx.where(eqn)

  def test(wg, *args):
    slot = refview.barrier_of(at(args[bar.index], args[bar.leaves]), "barrier_test")
    n = _next_completion(wg, slot, "barrier_test")
    # (resumed at its own time: every completion before it has been applied)
    yield catch_up("barrier_test", where)
    done = slot.completions >= n and slot.completed_at[n - 1] <= wg.time
    if done:
      wg.bar_waits[slot] = n
      slot.waits[wg] = [n, where]
      wg.block.hb.waited(wg, slot, n, where)
    return np.bool_(done)
  return Gen(test)


@rule("barrier_wait")
def _barrier_wait(eqn, cx):
  bar, at, _ = _barrier(eqn)
  where = cx.where(eqn)
  timing = cx.timing

  def wait(wg, *args):
    slot = refview.barrier_of(at(args[bar.index], args[bar.leaves]), "barrier_wait")
    n = _next_completion(wg, slot, "barrier_wait")
    wg.bar_waits[slot] = n
    if wg not in slot.waits:  # a waiter from now on
      slot.waits[wg] = [n - 1, where]
    if slot.completions > n:
      # mbarrier waits are by phase parity: completion #n+1 already happened,
      # so the hardware would take this wait for completion #n+2.
      barriers.lost_completion(
          slot, wg, where,
          f"barrier {slot.name} completed {slot.completions} times before "
          f"thread {wg.index}'s wait #{n} for completion #{n}: waits go by phase "
          "parity, so on hardware this wait would wait for a later completion; "
          "each completion must be observed by one wait of each waiting thread "
          "before the next one")
    start = wg.time
    if slot.completions < n:
      yield Wait(lambda: slot.completions >= n, (slot,),
                 lambda: f"barrier_wait on {slot.name} (completion #{n}"
                         f"{barriers.phase_state(slot)})", where)
    if slot.completed_at[n - 1] > wg.time:  # (found it before it happened)
      wg.time = slot.completed_at[n - 1]
    if wg.time > start:
      wg.block.event(wg.name, f"wait {slot.name}", start, wg.time)
      wg.stalled("TMA" if slot.by_copy[n - 1] else "barrier", start)
    slot.waits[wg] = [n, where]
    wg.block.hb.waited(wg, slot, n, where)
    wg.time += timing.barrier_latency
    return []
  return Gen(wait)


@rule("barrier_arrive_and_wait")
def _barrier_arrive_and_wait(eqn, cx):
  # One arrival, then a wait for the completion it may have made: the
  # lowering emits the two in this order.
  arrive, wait = _barrier_arrive(eqn, cx), _barrier_wait(eqn, cx).fn

  def arrive_and_wait(wg, *args):
    arrive(wg, *args)
    return (yield from wait(wg, *args))
  return Gen(arrive_and_wait)


@rule("commit_smem")
def _commit_smem(eqn, cx):
  # Async-proxy fence + warpgroup barrier: no effect on values (plain stores
  # are immediate); for happens-before, it publishes this warpgroup's plain
  # SMEM accesses so far to the async work it issues next.
  def commit(wg):
    wg.block.hb.commit_smem(wg)
    return []
  return commit


@rule("set_max_registers")
def _set_max_registers(eqn, cx):
  return lambda wg: []


@rule("delay")
def _delay(eqn, cx):
  # pl.delay: the thread sleeps (nanosleep) for about that long.
  per_ns = cx.timing.gpu.clock_hz * 1e-9

  def delay(wg, nanos):
    wg.time += float(nanos) * per_ns
    return []
  return delay
