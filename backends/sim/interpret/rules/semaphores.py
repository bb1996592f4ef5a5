"""Semaphores in GMEM: `pl.get_global(plgpu.SemaphoreType.REGULAR)` (one per
call site, shared by every block of the launch), semaphores allocated by
`run_scoped` / `scratch_types` (one per block), and `semaphore_signal`,
`semaphore_wait`, `semaphore_read` (pallas' and plgpu's, with
`memory_scope`).

As the lowering (mosaic/gpu/utils.py SemaphoreRef): a signal is an atomic
add of `inc` (followed by a release fence); a wait spins until the value
is at least `value` (unsigned), then subtracts it when `decrement`; a read
is an acquire load. All start at zero in each launch (the lowering passes
zeros). For happens-before, a signal releases what the signalling thread
knows and a wait or read acquires the signals it could not have completed
without (checks/semaphore_order.py).

A kernel with global semaphores has blocks that wait for each other: its
blocks run as one group (execute/executor.py), as if all were resident at once.
"""
import jax.numpy as jnp
import numpy as np
from jax import tree_util

from pallas_sim.backends.sim.checks.semaphore_order import SemLog
from pallas_sim.backends.sim.interpret import refview
from pallas_sim.backends.sim.base import jax_internals as jx
from pallas_sim.backends.sim.interpret.compiler import Gen, rule
from pallas_sim.backends.sim.machine import memory
from pallas_sim.backends.sim.machine.scheduler import Resource, Wait
from pallas_sim.errors import KernelError, UnsupportedPrimitiveError


class Semaphores(memory.Buffer):
  """A semaphore array (all zero when made); `res`: its waiters; `logs`:
  each element's signals and acquires, for the happens-before observer
  (semaphore_order.SemLog), made as it is first used; `start`: the values
  the launch began with; `signalled`: each element's latest signal's time (a
  thread whose clock is behind it sees the count no sooner)."""
  __slots__ = ("res", "logs", "start", "signalled")

  def __init__(self, name, shape):
    super().__init__(name, "sem", np.zeros(shape, np.uint32))
    self.res = Resource(f"semaphore {name}")
    self.logs = {}
    self.start = self.data.copy()
    self.signalled = {}

  def element(self, view):
    """The flat index of the element `view` (a view of one element) is."""
    return (view.__array_interface__["data"][0] - self.address()) // self.data.itemsize

  def log(self, view):
    """The SemLog of the element `view` (a view of one element) holds."""
    at = self.element(view)
    log = self.logs.get(at)
    if log is None:
      name = self.name if self.data.size == 1 else (
          f"{self.name}{list(np.unravel_index(at, self.data.shape))}")
      log = self.logs[at] = SemLog(name, self.start.flat[at])
    return log


def is_semaphore(aval):
  return jnp.issubdtype(aval.dtype, jx.pallas_core.semaphore)


def holds_semaphores(aval):
  """Whether a kernel operand (a GMEM Ref) holds semaphores: one made by
  plgpu.alloc_semaphore outside the kernel."""
  return is_semaphore(getattr(aval, "inner_aval", aval))


def input_semaphores(name, aval, array):
  """The semaphores a kernel operand that holds_semaphores carries in; the
  kernel's callback receives their values as int32."""
  sems = Semaphores(name, tuple(getattr(aval, "inner_aval", aval).shape))
  sems.data[...] = np.asarray(array).view(np.uint32).reshape(sems.data.shape)
  sems.start = sems.data.copy()
  return sems


def _sem(ref, transforms, prim, wg):
  r = refview.apply(ref, transforms, wg)
  if r.buf.space != "sem":
    raise KernelError(f"{prim} on {r.buf.name}, which is not a semaphore")
  if r.view.size != 1:
    raise KernelError(f"{prim} on {r.view.size} semaphores of {r.buf.name} at "
                      "once: index one")
  return r


@rule("get_global")
def _get_global(eqn, cx):
  what = eqn.params["what"]
  if not is_semaphore(what):
    raise UnsupportedPrimitiveError(f"get_global only supports semaphores, got {what}")
  key = id(eqn)
  shape = tuple(what.shape)

  def get_global(wg):
    made = wg.block.group.globals
    buf = made.get(key)
    if buf is None:
      buf = made[key] = Semaphores(f"global semaphore {len(made)}", shape)
    return refview.root_ref(buf)
  return get_global


def _signal_one(wg, ref, transforms, inc, device_id, prim, where=None):
  if device_id is not None:
    raise UnsupportedPrimitiveError(
        f"{prim} to another device or core: one GPU is simulated")
  r = _sem(ref, transforms, prim, wg)
  r.view[...] = r.view + np.uint32(np.int64(inc) & 0xFFFFFFFF)
  add = int(inc) & 0xFFFFFFFF  # (as a signed add: a negative one takes away)
  wg.block.hb.sem_signal(wg, r.buf.log(r.view), add - (add >> 31 << 32), where)
  at = r.buf.element(r.view)
  r.buf.signalled[at] = max(r.buf.signalled.get(at, 0.0), wg.time)
  wg.sched.notify(r.buf.res, at=wg.time)


@rule("semaphore_signal")
def _signal(eqn, cx):
  tree = eqn.params["args_tree"]
  where = cx.where(eqn)

  def signal(wg, *operands):
    ref, transforms, inc, device_id, core_index = tree_util.tree_unflatten(tree, operands)
    _signal_one(wg, ref, transforms, inc,
                device_id if core_index is None else core_index, "semaphore_signal",
                where)
    return []
  return signal


@rule("semaphore_signal_parallel")
def _signal_parallel(eqn, cx):
  # Each signal releases what the thread did before it (one fence for all,
  # on the GPU); their arrivals are unordered there, in order here.
  tree = eqn.params["args_tree"]
  where = cx.where(eqn)

  def signal_parallel(wg, *operands):
    refs, transforms, incs, device_ids = tree_util.tree_unflatten(tree, operands)
    for ref, tr, inc, dev in zip(refs, transforms, incs, device_ids):
      _signal_one(wg, ref, tr, inc, dev, "semaphore_signal_parallel", where)
    return []
  return signal_parallel


@rule("semaphore_wait")
def _wait(eqn, cx):
  tree = eqn.params["args_tree"]
  where = cx.where(eqn)
  # (a semaphore is a word of GMEM that the wait polls with atomics: it returns
  # a poll's round trip after it began, or the hand-off's latency after the
  # signal it needed, whichever is later: gpus.GPU.semaphore_latency)
  poll = cx.timing.gpu.gmem_load_latency
  handoff = cx.timing.gpu.semaphore_latency

  def wait(wg, *operands):
    ref, transforms, value, decrement = tree_util.tree_unflatten(tree, operands)
    r = _sem(ref, transforms, "semaphore_wait", wg)
    want = np.uint32(np.int64(value) & 0xFFFFFFFF)
    if r.view.reshape(()) < want:
      start = wg.time
      yield Wait(lambda: r.view.reshape(()) >= want, (r.buf.res,),
                 lambda: f"semaphore_wait on {r.buf.name} (for {int(want)}; it holds "
                         f"{int(r.view.reshape(()))})", where)
      wg.stalled("barrier", start)
    # (the count it saw was there no sooner than the latest signal)
    signalled = r.buf.signalled.get(r.buf.element(r.view), 0.0)
    if decrement:
      r.view[...] = r.view - want
    wg.block.hb.sem_acquire(wg, r.buf.log(r.view), int(want), decrement, where)
    wg.time = max(wg.time + poll, signalled + handoff)
    return []
  return Gen(wait)


@rule("semaphore_read")
def _read(eqn, cx):
  tree = eqn.params["args_tree"]

  latency = cx.timing.gpu.gmem_load_latency

  def read(wg, *operands):
    ref, transforms = tree_util.tree_unflatten(tree, operands)
    r = _sem(ref, transforms, "semaphore_read", wg)
    value = np.int32(r.view.reshape(()).view(np.int32))
    wg.block.hb.sem_acquire(wg, r.buf.log(r.view), int(value), False, read=True)
    wg.time += latency  # (a load of GMEM)
    return value
  return read
