"""Which blocks of a launch do the same work, for ps.estimate: read off the
kernel's jaxpr, not guessed.

A block's simulated time depends on the path its control flow takes (cond
branches, loop trip counts, predicated copies, pl.delay) and on how many
blocks share its SM (timing/model.py); the sizes of its copies and wgmmas
are static. So blocks whose control flow cannot depend on which block they
are take the same time given the same share. `variation` traces, through
every equation and nested jaxpr, what each value depends on: the block's
grid index (program_id, axis_index over a grid axis) or data (anything read
from a ref). It returns the first control decision that depends on either,
or None when none does. (Cluster and thread indices are the same in every
group of a launch: they do not make groups differ.)

The same walk says, for each TMA load, which grid axes its source address
depends on (`analyse`): blocks that agree on those axes read the same
bytes there, which the L2 model of timing/model.py counts once per wave."""
from typing import Any

import jax.numpy as jnp

from pallas_sim.backends.sim.base import locations
from pallas_sim.backends.sim.analysis import congruence, walker
from pallas_sim.backends.sim.interpret import operands, refview

GRID = "the block's grid index"
DATA = "values read from memory"
# (a value some float operation computed: an estimate that skips float math
# must not, where a decision or an address depends on one)
FLOAT = ("float", 0)

_NONE: frozenset[Any] = frozenset()  # taints: DATA, and ("grid", dimension) per grid axis
# On a ref: it is (a view of) a kernel input whose values are known, and
# reading it is not counted as data (analyse's `known_inputs`)
KNOWN = ("known",)


def _is_ref(v):
  return hasattr(v.aval, "inner_aval")


class _Walk(walker.Forward):
  """One walk over a kernel: `grid` maps grid axis names to dimensions;
  `loads` collects each TMA load's source-address taint (id(eqn) -> taint);
  `found` is the first control decision that varies, or the first that
  depends on data where one does: (taint, "the user's file:line: what the
  decision is"). A value's taint: what it depends on (frozensets, joined
  by union)."""

  unknown = _NONE

  def __init__(self, grid_names, starts=None):
    self.grid = {n: d for d, n in enumerate(grid_names)}
    self.starts = starts  # (congruence.analyse: what integers are multiples of)
    self.loads = {}
    self.found = None
    self.float_matters = False  # a decision or an address depends on float math
    # The user's file:line of the equations being walked, innermost last (an
    # equation JAX traced for the user, inside emit_pipeline, takes the
    # line of the user's call that holds it)
    self.where = ["<unknown location>"]
    # run_state's refs box values, not memory: a ref's taint is a marker
    # ("ref", k) and contents[k] what was put in it (reads give that)
    self.contents = {}

  def leaves(self, eqn, positions):
    """The congruences of eqn's inputs at `positions` (a slice; None: unknown)."""
    cs = self.starts.of(eqn) if self.starts is not None else None
    return None if cs is None else cs[positions]

  def join(self, a, b):
    return a | b

  def mixed(self, values):
    return _union(values)

  def result(self, var, taint):
    return taint | {FLOAT} if _value_of(var, jnp.floating) else taint

  def entering(self, eqn, ins):
    self.where.append(locations.eqn_location(eqn) or self.where[-1])

  def leaving(self, eqn):
    self.where.pop()

  def branch_index(self, eqn, index):
    _decide(index, eqn, self, "which branch a cond takes")

  def trip_count(self, eqn, cond_outs):
    [c] = cond_outs
    _decide(c, eqn, self, "a loop's trip count")

  def transfer(self, eqn, ins):
    return _eqn(eqn, ins, self)

  def run_state(self, eqn, form, ins):
    return _run_state(eqn, form, ins, self)


def analyse(jaxpr, grid_names, data_inputs=(), sizes=None, known_inputs=()):
  """(variation, load axes) of a kernel, in one walk.

  variation: None, or (what the first varying control decision depends on,
  DATA where any depends on data, the user's file:line of it). load axes: {id(TMA load equation): the grid
  dimensions its source address depends on, as a sorted tuple, or None
  where it depends on data}. `data_inputs`: positions of inputs that are
  values rather than refs and count as data (a kernel's inputs are refs:
  what is read from them is). `sizes`: axis name (and grid dimension) ->
  its size, which bound the indices (whether a box can reach past the
  array's end: _cut_leaves). `known_inputs`: positions of input refs whose
  reads do not count as data (ps.estimate asks whether a decision reads
  only inputs whose values it has)."""
  taint = [frozenset([DATA]) if i in data_inputs else
           frozenset([KNOWN]) if i in known_inputs else _NONE
           for i in range(len(jaxpr.invars))]
  w = _Walk(grid_names, congruence.analyse(jaxpr, sizes))
  w.walk(jaxpr, taint)
  varies = None
  if w.found is not None:
    why, where = w.found
    varies = (DATA if DATA in why else GRID, where)
  return Analysis(varies, {k: None if DATA in t else tuple(sorted(d for _, d in t))
                           for k, t in w.loads.items()}, w.float_matters)


class Analysis(tuple):
  """(variation, load axes), and whether float math decides anything."""
  float_matters: bool

  def __new__(cls, variation: Any, load_axes: dict[Any, Any], float_matters: bool
              ) -> "Analysis":
    self = super().__new__(cls, (variation, load_axes))
    self.float_matters = float_matters
    return self


def variation(jaxpr, grid_names, data_inputs=()):
  """analyse's variation alone."""
  return analyse(jaxpr, grid_names, data_inputs)[0]


def _is_box(t):
  return type(t) is tuple and t[0] == "ref"


def _strip(taint):
  """A taint without ref markers (run_state's boxes, KNOWN)."""
  return frozenset(t for t in taint if not _is_box(t) and t != KNOWN) if taint else taint


def _boxes(taint):
  return [t[1] for t in taint if _is_box(t)]


def _value_of(v, kind):
  """Whether v is a value (not a ref) whose dtype is of `kind`."""
  dtype = getattr(v.aval, "dtype", None)
  return not _is_ref(v) and dtype is not None and jnp.issubdtype(dtype, kind)


def _used(taint, grid):
  """A taint that a decision or an address uses: without ref markers, and
  without FLOAT, which it notes (float math matters there)."""
  taint = _strip(taint)
  if FLOAT in taint:
    grid.float_matters = True
    taint = taint - {FLOAT}
  return taint


def _decide(taint, eqn, grid, what):
  """A decision (`what` it is, in words for the report) that depends on
  `taint`."""
  taint = _used(taint, grid)
  # (a decision on data outranks one on the grid: it decides whether an
  # estimate computes values, executor.prepare)
  if taint and (grid.found is None or DATA in taint and DATA not in grid.found[0]):
    grid.found = (taint, f"{grid.where[-1]}: {what}")


def _union(ts):
  out = _NONE
  for t in ts:
    out = out | t
  return out


def _eqn(eqn, ins, grid):
  """The taints of the results of an equation without bodies; notes the
  decisions it makes and the TMA load it issues."""
  name = eqn.primitive.name
  p = eqn.params
  n_out = len(eqn.outvars)
  if name == "program_id":
    return [frozenset([("grid", p["axis"])])] * n_out
  if name == "axis_index":
    axes = p.get("axis_name")
    axes = axes if isinstance(axes, (tuple, list)) else (axes,)
    return [frozenset(("grid", grid.grid[a]) for a in axes if a in grid.grid)] * n_out
  if name == "copy_gmem_to_smem":
    _tma_load(eqn, ins, grid)
  if name == "copy_smem_to_gmem":
    op = operands.tma_store(eqn)
    if op.predicate is not None:
      _decide(ins[op.predicate], eqn, grid, "a TMA store's predicate")
    dst = op.dst
    cut = _cut_leaves(eqn.invars[dst.index].aval, dst.tree, grid.leaves(eqn, dst.leaves))
    _decide(_union(ins[dst.leaves.start + k] for k in cut), eqn, grid,
            "a TMA store's box, which may be cut at the array's ends")
  if name in ("barrier_wait", "barrier_arrive"):  # (which barrier; an arrive's predicate)
    op = operands.barrier_use(eqn)
    which = ins[op.barrier.leaves] + ([] if op.predicate is None else [ins[op.predicate]])
    _decide(_union(which), eqn, grid, f"which barrier a {name} uses, or its predicate")
  if name == "delay":
    _decide(ins[0], eqn, grid, "pl.delay's cycles")
  refs = [t for v, t in zip(eqn.invars, ins) if _is_ref(v)]
  if refs and any(FLOAT in t and _value_of(v, jnp.integer) for v, t in zip(eqn.invars, ins)):
    grid.float_matters = True  # (an index into a ref from float math)
  boxed = [k for t in refs for k in _boxes(t)]
  taint = _strip(_union(ins)) | _union(grid.contents[k] for k in boxed)
  known = sum(1 for t in refs if KNOWN in t and not _boxes(t))
  if len(boxed) < len(refs) - known:  # (a read of memory, or a write)
    taint = taint | {DATA}
  if boxed and name != "get":  # (swap, addupdate, or an op that may write one)
    for k in boxed:
      grid.contents[k] = grid.contents[k] | taint
  return [taint] * n_out


def _tma_load(eqn, ins, grid):
  """A TMA load: its source address's taint; its predicate, its barrier
  and a box cut at the array's ends are decisions."""
  op = operands.tma_load(eqn)
  src = _used(_union([ins[op.src.index]] + ins[op.src.leaves]), grid)
  grid.loads[id(eqn)] = grid.loads.get(id(eqn), _NONE) | src
  if op.predicate is not None:
    _decide(ins[op.predicate], eqn, grid, "a TMA load's predicate")
  # (which barrier it completes; and a box cut at the array's ends moves
  # fewer bytes: where its start depends on the grid or on data, a decision)
  if op.barrier is not None:
    _decide(_union(ins[op.barrier.leaves]), eqn, grid,
            "which barrier a TMA load completes")
  first = op.src.leaves.start
  cut = _cut_leaves(eqn.invars[op.src.index].aval, op.src.tree,
                    grid.leaves(eqn, op.src.leaves))
  _decide(_union(ins[first + k] for k in cut), eqn, grid,
          "a TMA load's box, which may be cut at the array's ends")


def _cut_leaves(aval, treedef, leaves):
  """Which of a TMA box's dynamic start leaves (positions in the transform
  chain's leaves) may take it past its view's ends in some block and not
  in another (TMA cuts it there, or moves nothing: fewer bytes, another
  time). Each indexer of the chain is held to the view it indexes, as the
  simulator cuts (refview); an integer index is a box of one. A start may
  pass the ends where its bounds do (below 0, or its highest plus the box
  past the end) or, bounds unknown, unless the box's size divides the axis
  and the start is always a multiple of it (`leaves`: the leaves'
  congruences, analysis/congruence.py; None: unknown, every leaf). (A start with no
  bounds that is a multiple of the box, wholly past the end in some block,
  is not seen.)"""
  if treedef is None or not treedef.num_leaves:
    return ()
  plans = refview.index_plans(treedef)
  if not plans or leaves is None:
    return range(treedef.num_leaves)
  dims = list(getattr(getattr(aval, "inner_aval", aval), "shape", ()))
  cut = []
  for plan in plans:
    kept = []
    for (i, _, size, stride), dim in zip(plan, dims):
      if size is not None:
        kept.append(size)
      if i is not None and (size is not None and stride != 1 or _may_pass(
          leaves[i], 1 if size is None else size, dim)):
        cut.append(i)
    dims = kept + dims[len(plan):]
  return cut


def _may_pass(c, size, dim):
  """Whether [start, start + size) may leave [0, dim), start of c."""
  _, _, lo, hi = c
  if lo is not None and lo < 0 or hi is not None and hi + size > dim:
    return True
  if lo is not None and hi is not None:
    return False
  return not (dim % size == 0 and congruence.is_multiple(c, size))


def _run_state(eqn, form, ins, grid):
  """pl.run_state: its body's refs box the operands' values; the outputs
  are what the boxes hold at the end (walked until no box grows)."""
  sub = form.body
  keys: list[Any] = []
  sub_in: list[Any] = []
  for v, t in zip(eqn.invars, ins):
    if _is_ref(v):  # (memory passed in stays memory)
      keys.append(None)
      sub_in.append(t)
      continue
    keys.append(len(grid.contents))
    grid.contents[keys[-1]] = _strip(t)
    sub_in.append(frozenset([("ref", keys[-1])]))
  held = lambda: [t if k is None else grid.contents[k] for k, t in zip(keys, sub_in)]
  while True:
    before = held()
    grid.walk(sub, sub_in)
    if held() == before:
      break
  return held()[:len(eqn.outvars)]
