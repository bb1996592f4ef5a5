"""The path each block takes, for ps.estimate of a kernel whose control flow
depends on the grid index (a persistent kernel's loop over tiles, causal
attention's loop bound, a predicated copy): blocks that take the same path,
sharing their SMs alike, take the same time, so one of them is simulated
for all.

A block's path is read off the kernel, not guessed: the kernel's jaxpr is
sliced down to what its control decisions (cond branches, while trip
counts, pl.delay, a copy's or an arrive's predicate, which barrier a wait
or an arrive uses, a TMA box cut at the array's ends) and its TMA loads'
addresses depend on, and that slice runs with the simulator's own rules
(integer index math, no data, no waits), for all the blocks at once where
it can (see "running the slice"): a few equations a loop step, once per
path, where the full simulation runs every block. It gives each block its
decisions (the classes) and the source of every TMA load it issues, for
the L2 model's trace of the launch (timing/model.py, hbm_reads_traced): a
block not simulated takes its class's issue cycles, load for load.

Where the slice would need a value read from memory, or a primitive it does
not know to be pure, there is no slice (`SliceError`) and every block is
simulated, as before. The exception: a read of a kernel input whose values
ps.estimate has (an array it was given, a constant the function captured)
and that no block writes (`known_reads`): the slice reads it as the
simulator does, and a block's path follows from those values (a ragged
dot's group sizes)."""
import collections
import typing
from typing import Any

import numpy as np
from jax.extend import core as jax_extend_core

from pallas_sim.backends.sim.analysis import walker
from pallas_sim.backends.sim.interpret import operands, refview
from pallas_sim.backends.sim.timing.model import Engines
from pallas_sim.backends.sim.base.loads import Joined, Load
from pallas_sim.errors import SimError


class SliceError(Exception):
  """The kernel cannot be sliced: why, in words."""


# Equations that do something besides giving values: never in a slice as values.
EFFECTS = frozenset(("delay", "debug_print", "debug_callback"))


def _is_ref(v):
  return hasattr(v.aval, "inner_aval")


def kernel_slice(jaxpr, reads=frozenset()):
  """{id(equation): which of its operands the slice needs} for the
  equations of `jaxpr` (nested ones included) that the kernel's control
  decisions and TMA load addresses depend on. Raises SliceError where one
  depends on something a slice cannot compute. `reads`: ids of `get`
  equations the slice may run (known_reads)."""
  slicer = _Slicer(reads)
  slicer.walk(jaxpr, [False] * len(jaxpr.outvars))
  return slicer.kept


def known_reads(jaxpr, known):
  """(ids of the `get` equations that read only kernel inputs at positions
  `known` (their values are given) that nothing in the kernel writes, the
  inputs they read): a slice may run them, their values are the inputs'."""
  refs = _InputRefs()
  refs.walk(jaxpr, [frozenset([i]) if i in known else frozenset()
                    for i in range(len(jaxpr.invars))])
  gets = {k: inputs for k, inputs in refs.gets.items()
          if inputs and not inputs & refs.written}
  return frozenset(gets), frozenset().union(*gets.values())


class Loop(typing.NamedTuple):
  """A kernel's persistent loop: a counted loop (lax.fori_loop's while: a
  carry counts by one up to a bound the loop leaves alone, as plgpu.nd_loop
  over the tiles of a persistent kernel) nested in no other loop, whose
  other carries no decision needs. Each iteration's decisions follow from
  its count and the block alone, so the slice runs a block's iterations as
  lanes, and an estimate times one iteration of each path
  (execute/extrapolate.py)."""
  eqn: int    # id of the while equation
  counter: int  # the counter's position in the carry
  bound: int  # the bound's


def persistent_loop(jaxpr, kept):
  """The kernel's one persistent Loop, or None (none, or several)."""
  found = []

  def visit(j, in_loop):
    for e in j.eqns:
      form = walker.structure(e)
      if form is None or getattr(form, "kind", None) == "map":
        continue
      if isinstance(form, walker.While):
        loop = None if in_loop else _counted(e, form, kept)
        if loop is not None:
          found.append(loop)
        visit(form.body, True)
      elif isinstance(form, walker.Scan):
        visit(form.body, True)
      elif isinstance(form, walker.Cond):
        for b in form.branches:
          visit(b, in_loop)
      else:
        for b in (form.body,) if isinstance(form, walker.RunState) else form.bodies:
          visit(b, in_loop)

  visit(jaxpr, False)
  return found[0] if len(found) == 1 else None


def _counted(eqn, form, kept):
  """A Loop of `eqn`, a while loop, where it is a counted loop whose other
  carries the slice does not need; else None."""
  flags = kept.get(id(eqn))
  cond, body, cn, bn = form.cond, form.body, form.cond_consts, form.body_consts
  if flags is None or len(cond.eqns) != 1:
    return None
  test = cond.eqns[0]
  carry = list(cond.invars[cn:])
  if (test.primitive.name != "lt" or cond.outvars[0] is not test.outvars[0]
      or not all(v in carry for v in test.invars)):
    return None
  index, bound = carry.index(test.invars[0]), carry.index(test.invars[1])
  ins = list(body.invars[bn:])
  if body.outvars[bound] is not ins[bound]:
    return None
  step = next((e for e in body.eqns if body.outvars[index] in e.outvars), None)
  one = lambda v: isinstance(v, jax_extend_core.Literal) and np.ndim(v.val) == 0 \
      and int(v.val) == 1
  if step is None or step.primitive.name != "add" or not any(
      a is ins[index] and one(b) for a, b in (step.invars, step.invars[::-1])):
    return None
  if any(f for k, f in enumerate(flags[cn + bn:]) if k not in (index, bound)):
    return None
  return Loop(id(eqn), index, bound)


class _InputRefs(walker.Forward):
  """Which kernel inputs (positions) each ref may be; the `get`s of them
  (id(eqn) -> inputs) and the inputs anything else may write (a TMA load
  only reads its source)."""

  unknown = frozenset()

  def __init__(self):
    self.gets, self.written = {}, set()

  def join(self, a, b):
    return a | b

  def mixed(self, values):
    return frozenset().union(*values)

  def transfer(self, eqn, ins):
    name = eqn.primitive.name
    src = operands.tma_load(eqn).src.index if name == "copy_gmem_to_smem" else None
    for k, (v, t) in enumerate(zip(eqn.invars, ins)):
      if not t or not _is_ref(v):
        continue
      if name == "get" and k == 0:
        self.gets[id(eqn)] = self.gets.get(id(eqn), frozenset()) | t
      elif k != src:
        self.written.update(t)
    return [frozenset()] * len(eqn.outvars)


class _Slicer(walker.Backward):
  """The slice: every control decision (the walker's), and the equations
  below (_eqn) with what they need."""

  KEEPS = "a decision or a TMA load"

  def __init__(self, reads=frozenset()):
    super().__init__()
    self.reads = reads  # (gets of known inputs: known_reads)
    # Per run_state body being sliced: its refs that box a value the body
    # only reads (a read of one is the value given: the slice may need it).
    self.boxes: list[frozenset[Any]] = [frozenset()]

  def refuse(self, why):
    raise SliceError(why)

  def transfer(self, eqn, outs):
    return _eqn(eqn, outs, self)

  def run_state(self, eqn, form, outs):
    return _run_state(eqn, form, outs, self)


def _eqn(eqn, outs, slicer):
  """Whether each operand of `eqn`, an equation without bodies, is needed,
  or None when eqn is not."""
  name = eqn.primitive.name
  n = len(eqn.invars)
  if name == "copy_gmem_to_smem":
    # (its source and destination with their indices: a multicast's part
    # depends on the destination's box; the barrier does not matter, its
    # indices do, as the predicate)
    need = [True] * n
    barrier = operands.tma_load(eqn).barrier
    if barrier is not None:
      need[barrier.index] = False
    return need
  if name in ("barrier_wait", "barrier_arrive"):  # (which barrier; an arrive's predicate)
    need = [True] * n
    need[operands.barrier_use(eqn).barrier.index] = False
    return need
  if name == "copy_smem_to_gmem":  # (its destination: a box past the ends is cut)
    need = [True] * n
    need[operands.tma_store(eqn).src.index] = False
    return need
  if name == "delay":
    return [True] * n
  if name == "get" and (eqn.invars[0] in slicer.boxes[-1] or id(eqn) in slicer.reads):
    return [True] * n if any(outs) else None
  if not any(outs):
    return None
  if name in EFFECTS or any(_is_ref(v) for v in list(eqn.invars) + list(eqn.outvars)):
    raise SliceError(f"a decision or a TMA load address depends on '{name}'")
  return [True] * n


def _run_state(eqn, form, outs, slicer):
  """pl.run_state: its body's refs box the operands (refs pass through);
  a value it only reads may be in the slice, through its reads."""
  sub = form.body
  if any(outs) or not all(eqn.params["is_initialized"]):
    if any(outs) or slicer.walk(sub, [False] * len(sub.outvars))[1]:
      raise SliceError("a decision or a TMA load depends on what a run_state "
                       "returns")
    return None
  uses = collections.defaultdict(set)
  for e in sub.eqns:
    for v in e.invars:
      if not isinstance(v, jax_extend_core.Literal):
        uses[v].add(e.primitive.name)
  slicer.boxes.append(frozenset(v for v, o in zip(sub.invars, eqn.invars)
                                if not _is_ref(o) and uses[v] <= {"get"}))
  try:
    flags, kept = slicer.body(sub, [False] * len(sub.outvars))
  finally:
    slicer.boxes.pop()
  return flags if kept else None


# --- running the slice --------------------------------------------------
#
# The slice runs for many blocks at once: each grid index is a vector over
# the blocks (lanes), and so is every value computed from it; the
# simulator's integer rules are numpy's, elementwise. Where the lanes decide
# alike, the run goes on as one; where they do not, the run stops and starts
# again for each set of lanes that decided alike (`Diverged`), so one run
# per path in all. A lane count that no shape in the kernel has keeps a
# vector of lanes from passing for an array of the kernel's own (numpy
# would broadcast it silently); anything the vectors cannot do (`NotLanes`)
# sends the launch to one run per block.

# The slice's own rules for what it records (the others are the
# simulator's): decisions go to the path, loads to the loads: (thread,
# site, source key, bytes), or for lanes (thread, site, [per lane]).
OVERRIDES = {}


def _override(name):
  def deco(builder):
    OVERRIDES[name] = builder
    return builder
  return deco


# A slice that runs this many decisions in one block is not cheaper than the
# block: every block is simulated instead.
MAX_DECISIONS = 2_000_000


class TooLong(SimError):
  pass


class NotLanes(SimError):
  """The slice cannot run its blocks as lanes: run it block by block."""


class Diverged(SimError):
  """The lanes decided apart: the sets of lanes (positions) that agree."""

  def __init__(self, parts):
    super().__init__(f"{len(parts)} ways")
    self.parts = parts


class _Lanes:
  __slots__ = ("n", "total")

  def __init__(self, n, total):
    self.n, self.total = n, total   # real lanes, and with the padding


def _per_lane(x, lanes):
  """Whether x holds a value per lane (lanes: the block's, or None)."""
  return lanes is not None and isinstance(x, np.ndarray) and x.shape == (lanes.total,)


def _lane(x, lanes, k):
  """Lane k's value of x (x itself where it is the same in every lane)."""
  return x[k] if _per_lane(x, lanes) else x


def _one(wg, x):
  """x, a decision's value, as the one value every lane takes."""
  a = np.asarray(x)
  if a.ndim == 0:
    return a[()]
  lanes = wg.block.engines.lanes
  if lanes is None or a.shape != (lanes.total,):
    raise NotLanes(f"a decision of shape {a.shape}")
  real = a[:lanes.n]
  if (real == real[0]).all():
    return real[0]
  raise Diverged([np.flatnonzero(real == v) for v in np.unique(real)])


def lanes_checked(fn, eqn):
  """fn, checking that with lanes every value it gives has its own shape,
  or one value per lane where it is a scalar: numpy broadcasts a vector of
  lanes against an axis of size 1 (or of the lanes' count) silently, and
  the lanes would pass for the array's elements."""
  shapes = [None if _is_ref(v) else tuple(getattr(v.aval, "shape", ())) for v in eqn.outvars]
  multi = eqn.primitive.multiple_results

  def checked(wg, *args):
    out = fn(wg, *args)
    lanes = wg.block.engines.lanes
    if lanes is not None:
      for v, shape in zip(out if multi else (out,), shapes):
        if v is None or shape is None:  # (a value the slice does not compute; a ref)
          continue
        got = np.shape(v)
        if got != shape and not (shape == () and got == (lanes.total,)):
          raise NotLanes(f"a value of shape {got} where the kernel's is {shape}")
    return out
  return checked


def _decided(wg, value):
  path = wg.block.engines.path
  path.append(value)
  if len(path) > MAX_DECISIONS:
    raise TooLong(f"a block's path runs past {MAX_DECISIONS} decisions")


@_override("cond")
def _cond(eqn, cx):
  from pallas_sim.backends.sim.interpret.compiler import Gen, run_gen, run_plain
  branches = [cx.compile(b) for b in walker.form_of(eqn, walker.Cond).given]
  last = len(branches) - 1

  def choose(wg, i):
    i = min(max(int(_one(wg, i)), 0), last)
    _decided(wg, i)
    return branches[i]

  if any(b.blocking for b in branches):  # (a branch that forks warps: plgpu.warp_map)
    def blocking(wg, i, *args):
      return (yield from run_gen(choose(wg, i), list(args), wg))
    return Gen(blocking)

  def cond(wg, i, *args):
    return run_plain(choose(wg, i), list(args), wg)
  return cond


def overrides(loop=None):
  """The slice's rules; with the kernel's persistent Loop, its iterations
  run as lanes (_iterations)."""
  if loop is None:
    return OVERRIDES
  return {**OVERRIDES, "while": lambda eqn, cx: (
      _iterations(eqn, cx, loop) if id(eqn) == loop.eqn else _while_rule(eqn, cx))}


@_override("while")
def _while_rule(eqn, cx):
  from pallas_sim.backends.sim.interpret.compiler import Gen, run_gen
  form = walker.form_of(eqn, walker.While)
  cond, body = map(cx.compile, form.given)
  cn, bn = form.cond_consts, form.body_consts

  def steps(wg, *args):
    cc, bc, carry = list(args[:cn]), list(args[cn:cn + bn]), list(args[cn + bn:])
    trips = 0
    while _one(wg, (yield from run_gen(cond, cc + carry, wg))[0]):
      carry = yield from run_gen(body, bc + carry, wg)
      trips += 1
      if trips > MAX_DECISIONS:
        raise TooLong(f"a loop runs past {MAX_DECISIONS} iterations")
    _decided(wg, ("trips", trips))
    return carry

  if cond.blocking or body.blocking:  # (a body that forks warps: plgpu.warp_map)
    return Gen(steps)

  def loop(wg, *args):  # (nothing in it blocks: run_gen never yields)
    gen = steps(wg, *args)
    try:
      next(gen)
    except StopIteration as done:
      return done.value
    raise AssertionError("a plain loop yielded")
  return loop


class IterationPaths(tuple):
  """A block's persistent loop in its path: each iteration's own path (a
  tuple of its decisions)."""


class _Iterations:
  """What the persistent loop did in a run of the slice, per block lane:
  each iteration's path and loads (`at`: how many of the run's loads came
  before the loop)."""

  def __init__(self, trips, at):
    self.paths = [[None] * t for t in trips]
    self.loads = [[None] * t for t in trips]
    self.at = at


def _iterations(eqn, cx, loop):
  """The persistent loop in the slice: every iteration of every block lane
  at once, as lanes of their own (the counter differs, the rest is the
  block's), split where they decide apart; each iteration's decisions are
  its own path (an _Iterations on the block's). What the loop gives back:
  the counter at its bound, the other carries as they came (no decision
  needs them: Loop)."""
  from pallas_sim.backends.sim.interpret.compiler import run_plain
  form = walker.form_of(eqn, walker.While)
  body = cx.compile(form.given[1])
  if body.blocking:  # (warp-level code in each iteration: not followed as lanes)
    raise SliceError("a persistent loop whose iterations fork warps (plgpu.warp_map)")
  cn, bn = form.cond_consts, form.body_consts
  dims = _shapes(cx.launch.jaxpr) if cx.launch is not None else {1}

  def run(wg, *args):
    bc, carry = list(args[cn:cn + bn]), list(args[cn + bn:])
    eng = wg.block.engines
    lanes = eng.lanes
    n = 1 if lanes is None else lanes.n
    lane_of = lambda x: _per_lane(x, lanes)
    start = np.asarray(carry[loop.counter])
    trips = np.maximum(np.asarray(carry[loop.bound]) - start, 0)
    trips = [int(trips[k] if lane_of(trips) else trips) for k in range(n)]
    owner = np.repeat(np.arange(n), trips)
    count = np.concatenate([np.arange(t) for t in trips] + [np.zeros(0, np.int64)])
    rec = _Iterations(trips, len(eng.loads))
    saved = eng.lanes, eng.path, eng.loads

    def part(sel):
      m = len(sel)
      total = m + 1
      while total in dims:
        total += 1
      pad = np.concatenate([sel, np.full(total - m, sel[0])])
      take = lambda x: x[owner[pad]] if lane_of(x) else x
      ins = [take(x) for x in bc + carry]
      first = take(start) if lane_of(start) else np.broadcast_to(start, (total,))
      ins[bn + loop.counter] = (first + count[pad]).astype(start.dtype)
      eng.lanes, eng.path, eng.loads = _Lanes(m, total), [], []
      try:
        run_plain(body, ins, wg)
      except Diverged as e:
        eng.lanes, eng.path, eng.loads = saved
        for q in e.parts:
          part(sel[q])
        return
      path, loads = tuple(eng.path), eng.loads
      eng.lanes, eng.path, eng.loads = saved
      for j, k in enumerate(sel):
        rec.paths[owner[k]][count[k]] = path
        rec.loads[owner[k]][count[k]] = loads[j::m]

    if len(owner):
      part(np.arange(len(owner)))
    eng.path.append(rec)
    out = list(carry)
    out[loop.counter] = np.maximum(start, np.asarray(carry[loop.bound])).astype(start.dtype)
    return out
  return run


@_override("get")
def _get(eqn, cx):
  """A read in the slice (a box's value, or a known input's:
  known_reads): where its indices differ by lane, lane by lane (the
  simulator's rule reads one index at a time)."""
  from pallas_sim.backends.sim.interpret.compiler import RULES
  read = RULES["get"](eqn, cx)

  def get(wg, ref, *leaves):
    lanes = wg.block.engines.lanes
    if not any(_per_lane(x, lanes) for x in leaves):
      return read(wg, ref, *leaves)
    each = [read(wg, ref, *[x[k] if _per_lane(x, lanes) else x for x in leaves])
            for k in range(lanes.total)]
    if any(np.ndim(v) for v in each):
      raise NotLanes("a read of an array whose indices differ by lane")
    return np.array(each)
  return get


@_override("delay")
def _delay(eqn, cx):
  def delay(wg, nanos):
    _decided(wg, ("delay", float(_one(wg, nanos))))
    return []
  return delay


def _boxes(wg, at, ref, leaves, plans, site):
  """The boxes of a TMA copy through `ref` for every lane: [(source key,
  bytes)] per lane, or one (key, bytes) where the indices are the same in
  every lane; a box cut at the array's ends is a decision (its shape)."""
  lanes = wg.block.engines.lanes
  if lanes is None or all(np.ndim(x) == 0 for x in leaves):
    got = at(ref, leaves)
    if got[2]:
      _decided(wg, ("cut", site, got[0][2]))
    return got[:2]
  if plans is None:
    raise NotLanes("a TMA box whose transforms are not plain indexers")
  # Plain indexers over the ref's view: the box's offset, lane by lane; its
  # cut, if any (a lane whose box reaches past the ends), a decision.
  view = ref.view
  base = view.__array_interface__["data"][0] - ref.buf.data.__array_interface__["data"][0]
  offset = np.full(lanes.total, base, np.int64)
  box = [(n, 0, n) for n in view.shape]   # per axis: size, in-bounds [lo, hi)
  strides = list(view.strides)
  for plan in plans:
    out, kept_strides = [], []
    for (i, static, size, stride), (n, lo, hi), st in zip(plan, box, strides):
      v = np.asarray(static if i is None else leaves[i], np.int64)
      if size is None:  # (an integer index: the axis goes)
        if not ((lo <= v) & (v < hi)).all():
          raise NotLanes("an integer index off the array in a TMA box")
        offset = offset + (v - lo) * st
        continue
      if stride != 1:
        raise NotLanes("a strided TMA box")
      new_lo = np.clip(lo - v, 0, size)
      new_hi = np.maximum(np.clip(hi - v, 0, size), new_lo)
      offset = offset + (v + new_lo - lo) * st
      out.append((size, new_lo, new_hi))
      kept_strides.append(st)
    box = out + box[len(plan):]
    strides = kept_strides + strides[len(plan):]
  shape = np.stack([np.broadcast_to(hi - lo, (lanes.total,)) for _, lo, hi in box])
  kinds, which = np.unique(shape[:, :lanes.n], axis=1, return_inverse=True)
  if kinds.shape[1] > 1:  # (boxes cut apart: each shape a path of its own)
    raise Diverged([np.flatnonzero(which.ravel() == c) for c in range(kinds.shape[1])])
  dims = tuple(int(d) for d in shape[:, 0])
  if dims != tuple(n for n, _, _ in box):
    _decided(wg, ("cut", site, dims))
  nbytes = int(np.prod(dims)) * view.itemsize
  name = ref.buf.name
  return [((name, int(offset[k]), dims), nbytes) for k in range(lanes.n)]


def _clipped_key(src_at):
  """(ref, leaves) -> (source key, bytes, cut) of a TMA box, one block's."""
  from pallas_sim.backends.sim.interpret.rules import tma

  def at(ref, leaves):
    s, _, inb = src_at(ref, leaves)
    return tma.source_key(s), s.view.nbytes, inb is not None
  return at


@_override("copy_gmem_to_smem")
def _load(eqn, cx):
  from pallas_sim.backends.sim.interpret.rules import tma
  p = eqn.params
  op = operands.tma_load(eqn)
  src, dst = op.src, op.dst
  src_at = refview.compile_clipped(src.tree)
  dst_at = refview.compile_transforms(dst.tree)
  barrier = op.barrier.leaves if op.barrier is not None and op.barrier.count else None
  pred_at = op.predicate
  collective = tuple(p.get("collective_axes") or ())
  site = cx.site(eqn)
  plans = refview.index_plans(src.tree)
  key_of = _clipped_key(src_at)
  # (source, its indices) -> (key, bytes, cut): blocks load the same tiles
  # over and over (a matmul's), and a box's view costs ~20 us to build
  seen: dict[Any, Any] = {}
  parts: dict[Any, Any] = {}  # (the same for a multicast's part of its box)

  def memo(ref, leaves):
    at = (id(ref.view), tuple(int(i) for i in leaves))
    hit = seen.get(at)
    if hit is None or hit[0] is not ref.view:  # (it holds the view: ids stay apart)
      hit = seen[at] = (ref.view,) + key_of(ref, leaves)
    return hit[1:]

  def multicast_part(sref, sl, dref, dl, part):
    """(key, bytes) of this block's part of a multicast's box."""
    at = (id(sref.view), id(dref.view), part) + tuple(int(i) for i in sl) + tuple(
        int(i) for i in dl)
    hit = parts.get(at)
    if hit is None or hit[0] is not sref.view or hit[1] is not dref.view:
      s_, _, _ = src_at(sref, sl)
      s_, _ = tma.partition(s_, dst_at(dref, dl), *part)
      hit = parts[at] = (sref.view, dref.view, tma.source_key(s_), s_.view.nbytes)
    return hit[2:]

  def load(wg, *ops):
    pred = bool(_one(wg, ops[pred_at])) if pred_at is not None else True
    if pred_at is not None:
      _decided(wg, pred)
    if barrier is not None:
      _decided(wg, ("barrier",) + tuple(int(_one(wg, x)) for x in ops[barrier]))
    if not pred:
      return []
    blk = wg.block
    if collective:
      peers = blk.group.peers(blk, collective)
      part = peers.index(blk), len(peers)
      lanes = blk.engines.lanes
      sref, dref = ops[src.index], ops[dst.index]
      sl, dl = ops[src.leaves], ops[dst.leaves]
      if lanes is None:
        got = multicast_part(sref, sl, dref, dl, part)
      else:  # (each lane's part of its box: lanes of a cluster's place alike)
        got = [multicast_part(sref, [_lane(x, lanes, k) for x in sl], dref,
                              [_lane(x, lanes, k) for x in dl], part) for k in range(lanes.n)]
    else:
      got = _boxes(wg, memo, ops[src.index], ops[src.leaves], plans, site)
    _record(blk, wg.index, site, got)
    return []
  return load


def _record(blk, thread, site, got):
  """A load's Load for each lane (one where the blocks do not run as
  lanes), in lane order: the slice keeps no time (cycle None)."""
  loads = blk.engines.loads
  if isinstance(got, list):
    loads.extend(Load(None, key, nbytes, thread, site) for key, nbytes in got)
  else:
    lanes = blk.engines.lanes
    key, nbytes = got[:2]  # (the third: whether the box was cut)
    loads.extend([Load(None, key, nbytes, thread, site)] * (1 if lanes is None else lanes.n))


def _barrier_use(eqn, cx):
  """barrier_wait / barrier_arrive in the slice: which barrier (and an
  arrive's predicate) is the decision; nothing waits or arrives."""
  op = operands.barrier_use(eqn)
  which = list(range(op.barrier.leaves.start, op.barrier.leaves.stop))
  which += [] if op.predicate is None else [op.predicate]

  def use(wg, *ops):
    _decided(wg, (eqn.primitive.name,) + tuple(int(_one(wg, ops[i])) for i in which))
    return []
  return use


OVERRIDES["barrier_wait"] = OVERRIDES["barrier_arrive"] = _barrier_use


@_override("copy_smem_to_gmem")
def _store(eqn, cx):
  op = operands.tma_store(eqn)
  dst = op.dst
  key_of = _clipped_key(refview.compile_clipped(dst.tree))
  plans = refview.index_plans(dst.tree)
  pred_at = op.predicate
  site = ("store", id(eqn))

  def store(wg, *ops):
    if pred_at is not None:
      _decided(wg, bool(_one(wg, ops[pred_at])))
    _boxes(wg, key_of, ops[dst.index], ops[dst.leaves], plans, site)  # (its cut, if any)
    return []
  return store


class Iterations(typing.NamedTuple):
  """A block's persistent loop: each iteration's path and loads, and how
  many of the block's loads came before the loop."""
  paths: list
  loads: list
  before: int


class Paths:
  """Every block's path and loads, and from them the classes."""

  def __init__(self, decisions, loads, iterations=None):
    self.decisions = decisions  # block number -> tuple of its decisions
    self.loads = loads          # block number -> [Load] (no cycles: the slice keeps none)
    # block number -> its Iterations, in a kernel with a persistent loop
    self.iterations = iterations or {}
    self.loop = None  # that Loop
    # (the simulated block joined last, and per order of (thread, site) its
    # loads come in, their cycles: a class's blocks mostly share one order)
    self._joined_rep: Any = None
    self._joined_cycles: dict[tuple, list] = {}
    self._orders: dict[int, tuple] = {}  # block number -> that order

  def key(self, number):
    return self.decisions[number]

  def frame(self, number):
    """A block's decisions but its persistent loop's iterations."""
    return tuple(ITERATIONS if isinstance(d, IterationPaths) else d
                 for d in self.decisions[number])

  def joined(self, number, rep_events):
    """Block `number`'s loads at the issue cycles of its class's simulated
    block (`rep_events`: its Loads, as the TMA rule traced them)."""
    sliced = self.loads[number]
    if self._joined_rep is not rep_events:
      self._joined_rep, self._joined_cycles = rep_events, {}
    order = self._orders.get(number)
    if order is None:  # (the same for every clock the launch is timed at)
      order = self._orders[number] = tuple([(ld.thread, ld.site) for ld in sliced])
    cycles = self._joined_cycles.get(order)
    if cycles is None:
      cycles = self._joined_cycles[order] = cycles_at(
          sliced, rep_events, 0.0, f"block {number}'s path", "its class's simulated block")
    return Joined(cycles, sliced)


def at_cycles(sliced, timed, offset, whose, against):
  """The slice's loads `sliced` (no cycles) at the cycles of `timed` (Loads a
  simulated run traced) plus `offset`: load for load, per thread and site in
  order (cycles_at). (Built as plain tuple copies: a persistent kernel's
  blocks issue thousands of loads each.)"""
  make = tuple.__new__
  return [make(Load, (c,) + ld[1:])
          for c, ld in zip(cycles_at(sliced, timed, offset, whose, against), sliced)]


def cycles_at(sliced, timed, offset, whose, against):
  """The issue cycle of each of the slice's loads `sliced`: that of the load
  of `timed` (Loads a simulated run traced) at its place among its thread's
  and site's, plus `offset`. `whose` and `against` name the two in the
  error where they differ."""
  cycles = collections.defaultdict(list)
  for ev in timed:
    cycles[ev.thread, ev.site].append(ev.cycle + offset)
  nxt = {k: iter(v).__next__ for k, v in cycles.items()}
  try:
    out = [nxt[ld.thread, ld.site]() for ld in sliced]
  except (KeyError, StopIteration):
    raise SimError(f"{whose} issues more TMA loads at a site than {against}") from None
  if len(out) != len(timed):
    raise SimError(f"{whose} issues {len(out)} TMA loads, {against} {len(timed)}")
  return out


class _Recorder:
  """A launch placement for the slice's run: engines that record the path
  and the loads (their timing is not used); `lanes`, when the blocks run
  as lanes."""

  def __init__(self, lanes=None):
    self.lanes = lanes

  def engines(self, number):
    e = _Recording(loads=True)
    e.path = []
    e.lanes = self.lanes
    return e


class _Recording(Engines):
  """Engines with the lanes they run for (None: one block)."""
  lanes: Any = None


def follow(make_runner, groups, launch, jaxpr):
  """Every block's path and loads: a Paths. `make_runner(placement)`: a
  GroupRunner of the sliced program over that placement."""
  if len(groups) > 1 and _alike(groups):  # (blocks, or clusters, as lanes)
    try:
      return as_lanes(make_runner, groups, _shapes(jaxpr))
    except TooLong:
      raise
    except SimError:  # (NotLanes, or a rule that cannot take lanes: block by block)
      pass
  runner = make_runner(_Recorder())
  out = Paths({}, {})
  for group in groups:
    result = runner.run(group)
    for number, st in zip(result.numbers, result.stats):
      _add_lane(out, number, st, 0, 1)
  return out


ITERATIONS = ("persistent loop",)  # (a frame's place for the iterations)


def _add_lane(out, number, st, k, n):
  """Block `number`'s path and loads into Paths `out`: lane k of n of a
  run of the slice (its stats `st`)."""
  decisions, loads = [], st.loads[k::n]
  for d in st.path:
    if isinstance(d, _Iterations):
      before = len(st.loads[:d.at][k::n])
      out.iterations[number] = Iterations(d.paths[k], d.loads[k], before)
      loads = loads[:before] + [ld for it in d.loads[k] for ld in it] + loads[before:]
      d = IterationPaths(d.paths[k])
    decisions.append(d)
  out.decisions[number], out.loads[number] = tuple(decisions), loads


def _alike(groups):
  """Whether the groups (blocks, or clusters) hold as many blocks each, at
  the same places in their clusters: lanes of one run."""
  first = groups[0]
  return all(len(g) == len(first) and all(m[2] == f[2] for m, f in zip(g, first))
             for g in groups)


def as_lanes(make_runner, groups, dims):
  """Every group of `groups` (a block, or the blocks of a cluster) through
  the slice at once, as lanes of its values (a cluster's blocks each lanes
  of the same place in every cluster), split where they decide apart: their
  Paths. Raises NotLanes where the lanes cannot be followed together
  (`follow` then runs the groups one by one, as tests make it to compare
  the two)."""
  out = Paths({}, {})
  todo = [np.arange(len(groups))]
  while todo:
    part = todo.pop()
    total = len(part) + 1
    while total in dims:  # (a lane count no array of the kernel has)
      total += 1
    lanes = _Lanes(len(part), total)
    pad = np.concatenate([part, np.full(total - len(part), part[0])])
    run = []
    for j, (number, idx, cidx) in enumerate(groups[part[0]]):
      run.append((number, tuple(np.array([groups[k][j][1][d] for k in pad], np.int32)
                                for d in range(len(idx))), cidx))
    runner = make_runner(_Recorder(lanes))
    try:
      result = runner.run(run)
    except Diverged as e:
      todo.extend(part[p] for p in e.parts)
      continue
    for j, st in enumerate(result.stats):  # (each load is one Load per lane, in lane order)
      for k, g in enumerate(part):
        _add_lane(out, groups[g][j][0], st, k, len(part))
  return out


def _shapes(jaxpr):
  """Every dimension of every array shape in the kernel (nested too)."""
  dims = {1}
  for j in walker.jaxprs(jaxpr):
    for v in list(j.invars) + list(j.constvars) + [v for e in j.eqns for v in e.outvars]:
      aval = getattr(v.aval, "inner_aval", v.aval)
      dims.update(getattr(aval, "shape", ()))
  return dims
