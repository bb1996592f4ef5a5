"""ps.estimate of a persistent kernel by its loop's iterations.

A persistent kernel (plgpu.nd_loop over its tiles in every block:
blocks/paths.py Loop) runs as many blocks as SMs, each looping over its
share of the tiles; blocks rarely take the same path (a ragged dot's tiles
at group edges store other rows), so one block per class would still
simulate most of them, each for all its tiles. But an iteration's time
follows from its own path: the slice gives every iteration's (paths.Paths
iterations), and a block's time is its prologue, its iterations one after
another, and its epilogue. So a few blocks run with their loop cut down to
a few iterations (`runs`: the first, and each path the launch has after
each it follows, and the last of each path), timed at each iteration's
start (`Mark`); every block's time, tallies and TMA loads (at their issue
cycles, for the L2 model) are then its prologue's, its iterations' and its
epilogue's, summed.

An iteration is timed as the first of its block's, or after the path before
it: the first starts on an idle SM, the others behind an iteration still
draining (its TMA stores, the tensor cores' queue)."""
import collections
import typing
from typing import Any

import numpy as np

from pallas_sim.backends.sim.base.loads import Load
from pallas_sim.backends.sim.blocks import paths
from pallas_sim.backends.sim.execute.group import GroupResult
from pallas_sim.backends.sim.interpret.compiler import RULES, Gen, run_gen
from pallas_sim.backends.sim.machine.state import STALLS, BlockStats
from pallas_sim.errors import SimError
from pallas_sim.backends.sim.analysis import walker

# BlockStats counters a mark takes, then the stalls, the units' work and the
# thread's clock (BlockStats.finish: tma_cycles, tensor_cycles, thread_cycles)
_COUNTS = ("tma_load_bytes", "tma_store_bytes", "wgmma_flops", "tensor_f16_flops",
           "hbm_read_cost", "hbm_write_cost", "plain_load_bytes", "plain_store_bytes")
_WHOLE = ("tma_load_bytes", "tma_store_bytes", "wgmma_flops", "plain_load_bytes",
          "plain_store_bytes")  # (counts, not weights)


class Mark(typing.NamedTuple):
  """A block's state as an iteration of its loop starts (or the loop ends):
  the thread's clock, its tallies, its load sites' [bytes, loads], how
  many TMA loads it has issued."""
  time: float
  tally: np.ndarray
  sites: dict
  loads: int


def _at(time, st, units, loads):
  """A Mark: `st` a block's BlockStats, `units` its (TMA, tensor core,
  thread clock) cycles, `loads` its Loads so far (or None)."""
  tally = np.array([getattr(st, f) for f in _COUNTS] + [st.stalls[k] for k in STALLS]
                   + list(units), np.float64)
  return Mark(time, tally, {k: tuple(v) for k, v in st.load_sites.items()},
              len(loads) if loads is not None else 0)


def _mark(wg):
  st, eng = wg.block.stats, wg.block.engines
  return _at(wg.time, st, (eng.tma_work, eng.tc_work, wg.time), eng.loads)


def _ended(cycles, st):
  """A finished block's Mark (BlockStats.finish has its units' work)."""
  return _at(cycles, st, (st.tma_cycles, st.tensor_cycles, st.thread_cycles), st.loads)


class Span(typing.NamedTuple):
  """What a stretch of a block took (between two Marks): cycles, tallies,
  load sites, and its TMA loads at cycles from the stretch's start (and
  their threads and sites, in order)."""
  cycles: float
  tally: np.ndarray
  sites: dict
  loads: list
  order: tuple


def _span(a, b, loads):
  sites = {k: (v[0] - a.sites.get(k, (0, 0))[0], v[1] - a.sites.get(k, (0, 0))[1])
           for k, v in b.sites.items()}
  rel = [ld._replace(cycle=ld.cycle - a.time) for ld in loads[a.loads:b.loads]]
  return Span(b.time - a.time, b.tally - a.tally, sites, rel,
              tuple((ld.thread, ld.site) for ld in rel))


def plan(found, groups, share, num_threads):
  """A Plan for a launch whose blocks' paths `found` (paths.Paths) hold a
  persistent loop that every block ran, one thread a block and no
  clusters; else None."""
  numbers = [m[0][0] for m in groups]
  if (not found.iterations or (num_threads or 1) != 1 or any(len(m) != 1 for m in groups)
      or any(b not in found.iterations for b in numbers)):
    return None
  return Plan(found, numbers, share)


class Plan:
  """Which blocks run which iterations (`runs`: block number -> iteration
  counts, ascending, the first always), and every block's result from
  theirs. `found`: the blocks' paths (paths.Paths, with iterations);
  `share`: block number -> how it shares its SM."""

  def __init__(self, found, numbers, share):
    self.found = found
    self.frames = {b: (share(b), found.frame(b)) for b in numbers}
    self.runs = {}
    covered = set()
    for b in numbers:
      its = found.iterations[b].paths
      f = self.frames[b]
      # What timing the block needs, and the iterations that give it: its
      # prologue, its first iteration, each after the one before it (what
      # that one leaves in flight, TMA stores and the tensor cores' queue,
      # is the next one's start), and its epilogue after its last (until
      # that one's TMA stores have landed).
      last = its[-1] if its else None
      want: dict[tuple[Any, ...], tuple[int, ...]] = {
          ("end", f, last): (len(its) - 1,) if its else ()}
      if its:
        want[("first", f, its[0])] = (0,)
      for t in range(1, len(its)):
        want.setdefault(("after", f[0], its[t - 1], its[t]), (t - 1, t))
      missing = [el for el in want if el not in covered]
      if missing:
        steps = {t for el in missing if el[0] != "end" for t in want[el]}
        steps |= {0} if its else set()
        if its and its[max(steps)] != last:  # (the run must end on a last path)
          steps.add(len(its) - 1)
        self.runs[b] = sorted(steps)
        covered.update(self._covers(b))
    self.spans = {}
    self.traced = True  # (the runs keep their TMA loads: the L2 model follows them)

  def _covers(self, b):
    its, f = self.found.iterations[b].paths, self.frames[b]
    steps = self.runs[b]
    return ([("end", f, its[steps[-1]] if steps else None)]
            + [self._element(f, its, steps, j) for j in range(len(steps))])

  @staticmethod
  def _element(f, its, steps, j):
    """What the j-th of the iterations `steps` (counts) of a block of
    frame f and iteration paths `its` times: the first, or one after the
    one run before it."""
    if j == 0:
      return ("first", f, its[steps[0]])
    return ("after", f[0], its[steps[j - 1]], its[steps[j]])

  @property
  def iterations(self):
    """How many iterations the runs simulate, and how many the launch has."""
    return (sum(len(s) for s in self.runs.values()),
            sum(len(self.found.iterations[b].paths) for b in self.frames))

  def rule(self, loop, marks):
    """The while rule that runs block b's persistent loop for the counts
    runs[b] alone, marking each iteration's start and the loop's end in
    marks[b] (other loops: the simulator's own)."""
    def build(eqn, cx):
      if id(eqn) != loop.eqn:
        return RULES["while"](eqn, cx)
      form = walker.form_of(eqn, walker.While)
      cond, body = map(cx.compile, form.given)
      cn, bn = form.cond_consts, form.body_consts

      def run(wg, *args):
        cc, bc, carry = list(args[:cn]), list(args[cn:cn + bn]), list(args[cn + bn:])
        mine = marks.setdefault(wg.block.number, [])
        start = np.asarray(carry[loop.counter])
        for t in self.runs[wg.block.number]:
          carry[loop.counter] = (start + t).astype(start.dtype)[()]
          yield from run_gen(cond, cc + carry, wg)  # (its cost, as the loop's)
          mine.append(_mark(wg))
          carry = list((yield from run_gen(body, bc + carry, wg)))
        carry[loop.counter] = np.maximum(start, np.asarray(carry[loop.bound])).astype(
            start.dtype)[()]
        yield from run_gen(cond, cc + carry, wg)
        mine.append(_mark(wg))
        return carry
      return Gen(run)
    return build

  def ran(self, result, marks):
    """Takes the spans of a run group's blocks (GroupResult `result`, their
    loops' Marks `marks`)."""
    for b, cycles, st in zip(result.numbers, result.cycles, result.stats):
      m, f = marks.get(b, []), self.frames[b]
      its = self.found.iterations[b].paths
      loads = st.loads or []
      self.traced = st.loads is not None
      if len(m) != len(self.runs[b]) + 1:
        raise SimError(f"block {b}'s persistent loop ran {len(m) - 1} iterations, "
                       f"{len(self.runs[b])} asked")
      zero = Mark(0.0, np.zeros_like(m[0].tally), {}, 0)
      self.spans.setdefault(("before", f), _span(zero, m[0], loads))
      steps = self.runs[b]
      self.spans.setdefault(("end", f, its[steps[-1]] if steps else None),
                            _span(m[-1], _ended(cycles, st), loads))
      for j in range(len(self.runs[b])):
        self.spans.setdefault(self._element(f, its, self.runs[b], j),
                              _span(m[j], m[j + 1], loads))

  def result(self, b):
    """Block b's GroupResult: its prologue, its iterations, and its
  epilogue after its last."""
    f = self.frames[b]
    it = self.found.iterations[b]
    every = range(len(it.paths))
    parts = ([("before", f)] + [self._element(f, it.paths, every, t) for t in every]
             + [("end", f, it.paths[-1] if it.paths else None)])
    slices = self.found.loads[b] if self.traced else []
    n_iter = [len(x) for x in it.loads]
    bounds = np.cumsum([it.before] + n_iter)
    pieces = [slices[:it.before]] + [slices[a:z] for a, z in zip(bounds[:-1], bounds[1:])]
    pieces.append(slices[bounds[-1]:])
    t, tally, loads = 0.0, None, []
    sites: collections.Counter[Any] = collections.Counter()
    count: collections.Counter[Any] = collections.Counter()
    for el, mine in zip(parts, pieces):
      sp = self.spans[el]
      loads += _timed(mine, sp, t, b)
      t += sp.cycles
      tally = sp.tally.copy() if tally is None else tally + sp.tally
      for k, (nb, nl) in sp.sites.items():
        sites[k] += nb
        count[k] += nl
    assert tally is not None  # (every path has a part: its end)
    st = BlockStats()
    for f_, x in zip(_COUNTS, tally):
      setattr(st, f_, int(round(x)) if f_ in _WHOLE else x)
    n = len(_COUNTS)
    st.stalls = dict(zip(STALLS, tally[n:n + len(STALLS)].tolist()))
    st.tma_cycles, st.tensor_cycles, st.thread_cycles = tally[n + len(STALLS):].tolist()
    st.load_sites = {k: [int(sites[k]), int(count[k])] for k in sites if count[k] or sites[k]}
    st.loads = loads if self.traced else None
    return GroupResult([b], [t], [st], [], [])


def _timed(sliced, span, offset, b):
  """The slice's loads `sliced` (no cycles) at the cycles of the Span timed
  for them (relative), plus `offset`: at once where their threads and sites
  come in the same order (the same path), else paths.at_cycles."""
  timed = span.loads
  if len(sliced) == len(timed) and tuple((ld.thread, ld.site) for ld in sliced) == span.order:
    make = tuple.__new__  # (a Load copied with its cycle: thousands a block)
    return [make(Load, (t.cycle + offset,) + ld[1:]) for ld, t in zip(sliced, timed)]
  return paths.at_cycles(sliced, timed, offset, f"block {b}'s path",
                         "the stretch timed for it")
