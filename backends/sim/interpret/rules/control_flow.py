"""Control flow inside kernels: scan / fori_loop, while, cond, and the call
wrappers (jit, custom_jvp/vjp, checkpoint: analysis/walker.py CALLS) that
just run their body. Each takes its bodies and their operands' counts from
the walker's structure of the equation, as the analyses do.

Each rule compiles its bodies once; when no body can block, the loop runs as
a plain function, otherwise as a generator that forwards the body's waits.
"""
from typing import Any

import numpy as np

from pallas_sim.backends.sim.base import jax_internals as jx
from pallas_sim.backends.sim.interpret.compiler import Gen, rule, run_gen, run_plain
from pallas_sim.backends.sim.analysis import walker
from pallas_sim.backends.sim.machine.scheduler import catch_up
from pallas_sim.errors import RunawayKernelError


def _maybe_gen(blocking, plain, gen):
  return Gen(gen) if blocking else plain


def _catch_up(cx, eqn):
  """Where the kernel's loops interleave (Compiler.interleave): the wait a
  loop gives at an iteration's end when something of its group is due
  before its clock. The simulation runs a warpgroup ahead until it blocks:
  a loop of ALU work that never waits would not see the wgmmas another
  warpgroup issues beside it, and ALU work beside them is slower
  (timing/model.py tensor_overlap). None where they do not."""
  return catch_up("a loop iteration", cx.where(eqn)) if cx.interleave else None


# Loops check the block's simulated time once per iteration (a loop is the
# only way a block runs without end: waits that never complete are
# deadlocks). Their counters are named `iteration`: progress reports and
# Ctrl-C backtraces (backends/sim/execute/progress.py) read them from the frames.
def _runaway(wg, iteration, limit):
  return RunawayKernelError(
      f"ran past max_cycles={limit:.0f} simulated cycles in this loop "
      f"(at iteration {iteration}; {wg.steps} equations run): a loop that does "
      "not end? Pass max_cycles= to simulate longer")


@rule("scan")
def _scan(eqn, cx):
  form = walker.form_of(eqn, walker.Scan)
  body = cx.compile(form.given[0])
  length, reverse = form.length, eqn.params["reverse"]
  # (jax binds a scan's length, and counts its consts and carry, in every
  # release of the window: walker.scan_counts)
  assert length is not None and form.counts is not None, eqn.params
  nc, ncarry = form.counts
  order = range(length - 1, -1, -1) if reverse else range(length)

  def split(args):
    return list(args[:nc]), list(args[nc:nc + ncarry]), args[nc + ncarry:]

  nys = len(body.outvars) - ncarry

  def collect(outs, ys):
    """Appends this iteration's ys; returns the new carry."""
    for acc, y in zip(ys, outs[ncarry:]):
      acc.append(y)
    return outs[:ncarry]

  def finish(carry, ys):
    return carry + [np.stack(y[::-1] if reverse else y) for y in ys]

  limit = cx.max_cycles
  sync = _catch_up(cx, eqn)

  # plain and gen are the same loop; gen forwards the body's waits.
  def plain(wg, *args):
    consts, carry, xs = split(args)
    ys: list[list[Any]] = [[] for _ in range(nys)]
    for iteration in order:
      carry = collect(run_plain(
          body, consts + carry + [x[iteration] for x in xs], wg), ys)
      if wg.time > limit:
        raise _runaway(wg, iteration, limit)
    return finish(carry, ys)

  def gen(wg, *args):
    consts, carry, xs = split(args)
    ys: list[list[Any]] = [[] for _ in range(nys)]
    for iteration in order:
      carry = collect((yield from run_gen(
          body, consts + carry + [x[iteration] for x in xs], wg)), ys)
      if wg.time > limit:
        raise _runaway(wg, iteration, limit)
      if sync is not None and wg.sched.due_before(wg.time):
        yield sync
    return finish(carry, ys)

  return _maybe_gen(body.blocking or sync is not None, plain, gen)


def _state(carry):
  """A carry as bytes: two states compare equal only bit for bit."""
  parts = []
  for x in carry:
    x = np.asarray(x)
    parts.append((x.dtype.str, x.shape, x.tobytes()))
  return tuple(parts)


class _Repeats:
  """Brent's cycle finding over a pure loop's states: each iteration's carry
  is compared with one kept state, which moves on at iterations 1, 2, 4, 8,
  ... since the last move; a loop that comes back to a state it had is
  found within about twice its lead-in and cycle, keeping one state."""
  __slots__ = ("kept", "kept_at", "power", "since")

  def __init__(self, carry):
    self.kept, self.kept_at, self.power, self.since = _state(carry), 0, 1, 0

  def seen(self, carry, iteration):
    """The iteration whose state this one's repeats, or None."""
    now = _state(carry)
    if now == self.kept:
      return self.kept_at
    self.since += 1
    if self.since == self.power:
      self.kept, self.kept_at, self.power, self.since = now, iteration, 2 * self.power, 0
    return None


def _stuck(iteration, before):
  if before == iteration - 1:
    what = "gave back the state it was given"
  else:
    what = (f"came back to the state it had after iteration {before} (a cycle of "
            f"{iteration - before})" if before else
            f"came back to the state the loop began with (a cycle of {iteration})")
  return RunawayKernelError(
      f"this loop never ends: iteration {iteration} {what}, and nothing else "
      "decides whether it goes on (its condition and body read no memory and wait "
      "on nothing)")


def _uses_carry(cond, nconsts):
  """Whether a while loop's condition reads its carry (its invars after
  the consts), directly or through the equations it feeds."""
  jaxpr = getattr(cond, "jaxpr", cond)
  carry = {id(v) for v in jaxpr.invars[nconsts:]}
  if any(id(v) in carry for v in jaxpr.outvars):
    return True
  return any(id(v) in carry for e in jaxpr.eqns for v in e.invars)


def _spinning(iteration, alone):
  if alone:
    why = ("which nothing else in this simulation can change any more: no other thread "
           "can run and nothing is in flight (a spin on a flag that nothing sets, or "
           "that another launch or block outside this group would set)")
  else:
    why = ("and the loop writes nothing and waits on nothing, so no other thread runs "
           "while it spins (they run in turns, each until it waits). On the GPU such a "
           "spin reads with nothing ordering it after the write it waits for, and the "
           "compiler may read once, before the loop: wait on a barrier or a semaphore "
           "instead")
  return RunawayKernelError(
      f"this loop never ends: at iteration {iteration} its condition still holds, "
      f"and it decides on memory alone (it does not look at the loop's carry), {why}")


@rule("while")
def _while(eqn, cx):
  form = walker.form_of(eqn, walker.While)
  cond, body = map(cx.compile, form.given)
  cn, bn = form.cond_consts, form.body_consts
  limit = cx.max_cycles
  sync = _catch_up(cx, eqn)
  # A loop without effects goes on or stops on its carry and consts alone:
  # a carry that comes back to a state it had loops for ever, which the
  # simulation would otherwise run to max_cycles (minutes of a tight scalar
  # loop).
  pure = not any(j.effects for j in form.given)
  # A loop that only reads memory, whose condition does not look at its
  # carry, decides on what it reads: where nothing else can change that
  # while it runs, a condition that held holds for ever (a spin on a flag
  # nothing sets). A loop that never yields runs alone: nothing else runs
  # between its iterations; one that yields, only once no other thread is
  # ready and nothing is in flight.
  spins = (not pure and all(jx.reads_only(j.effects) for j in form.given)
           and not _uses_carry(form.cond, cn))

  def plain(wg, *args):
    cc, bc, carry = list(args[:cn]), list(args[cn:cn + bn]), list(args[cn + bn:])
    iteration = 0
    states = _Repeats(carry) if pure else None
    while run_plain(cond, cc + carry, wg)[0]:
      carry = run_plain(body, bc + carry, wg)
      iteration += 1
      if wg.time > limit:
        raise _runaway(wg, iteration, limit)
      if states is not None and (before := states.seen(carry, iteration)) is not None:
        raise _stuck(iteration, before)
      if spins:
        raise _spinning(iteration, wg.sched.idle())
    return carry

  def gen(wg, *args):
    cc, bc, carry = list(args[:cn]), list(args[cn:cn + bn]), list(args[cn + bn:])
    iteration = 0
    states = _Repeats(carry) if pure else None
    while (yield from run_gen(cond, cc + carry, wg))[0]:
      carry = (yield from run_gen(body, bc + carry, wg))
      iteration += 1
      if wg.time > limit:
        raise _runaway(wg, iteration, limit)
      if states is not None and (before := states.seen(carry, iteration)) is not None:
        raise _stuck(iteration, before)
      if spins and wg.sched.idle():
        raise _spinning(iteration, True)
      if sync is not None and wg.sched.due_before(wg.time):
        yield sync
    return carry

  return _maybe_gen(cond.blocking or body.blocking or sync is not None, plain, gen)


@rule("cond")
def _cond(eqn, cx):
  branches = [cx.compile(b) for b in walker.form_of(eqn, walker.Cond).given]
  last = len(branches) - 1

  def pick(i):
    return branches[min(max(int(i), 0), last)]  # lax.switch clamps

  def plain(wg, i, *args):
    return run_plain(pick(i), list(args), wg)

  def gen(wg, i, *args):
    return (yield from run_gen(pick(i), list(args), wg))

  return _maybe_gen(any(b.blocking for b in branches), plain, gen)


@rule(*walker.CALLS)
def _call(eqn, cx):
  body = cx.compile(walker.form_of(eqn, walker.Call).given[0])

  def plain(wg, *args):
    return run_plain(body, list(args), wg)

  def gen(wg, *args):
    return (yield from run_gen(body, list(args), wg))
  return _maybe_gen(body.blocking, plain, gen)
