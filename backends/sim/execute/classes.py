"""Which groups of a launch ps.estimate simulates (Options.block_classes):
one per class of groups whose blocks share their SMs alike and take the
same path; the others take its times (merge.Merge.same_as)."""
import copy
import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from pallas_sim.backends.sim.base import locations
from pallas_sim.backends.sim.blocks import block_classes
from pallas_sim.backends.sim.blocks import paths
from pallas_sim.backends.sim.checks import races
from pallas_sim.backends.sim.execute import extrapolate
from pallas_sim.backends.sim.execute.group import GroupRunner, RunChecks
from pallas_sim.backends.sim.execute.prepare import axis_sizes
from pallas_sim.backends.sim.interpret.compiler import Compiler
from pallas_sim.errors import EstimateWarning


def _on_zeros(launch, where, jaxpr):
  """ps.estimate given shapes, of a kernel whose control flow reads memory:
  the report's words for what stood in for the values it does not have, and
  a warning naming those inputs and the decision's line, unless no decision
  reads anything but inputs whose values it has (constants the function
  captured, arrays given)."""
  if launch.unknown_inputs is None:  # (run through XLA: which inputs is not known)
    locations.warn_at(EstimateWarning(
        f"ps.estimate: kernel {launch.name}'s control flow depends on values read "
        f"from memory ({where}), and inputs were given as shapes: zeros stand in for "
        "them. Pass arrays to estimate the paths their values take."), where)
    return ", on zeros for the inputs given as shapes"
  def on_data(known):  # (the first decision on data, reads of `known` inputs not counted)
    found = block_classes.analyse(jaxpr, launch.grid_names, sizes=axis_sizes(launch),
                                  known_inputs=known)[0]
    return found[1] if found is not None and found[0] == block_classes.DATA else None

  every = range(launch.num_inputs)
  unknown = sorted(launch.unknown_inputs)
  where = on_data([i for i in every if i not in launch.unknown_inputs])
  if not unknown or where is None:
    return ", on the values of the inputs it was given"  # (its decisions read only those)
  # Which inputs given as shapes a decision reads: each alone unknown. Where
  # a decision reads memory that is not an input (SMEM, outputs), none can
  # be told apart: all are named.
  if on_data(list(every)) is None:
    unknown = [i for i in unknown if on_data([j for j in every if j != i]) is not None]
  names = [launch.arg_names[i] if i < len(launch.arg_names) else f"input {i}"
           for i in unknown]
  locations.warn_at(EstimateWarning(
      f"ps.estimate: kernel {launch.name}'s control flow depends on values read "
      f"from memory ({where}), and {', '.join(names)} "
      f"{'was' if len(names) == 1 else 'were'} given as a shape: zeros stand in for "
      f"{'it' if len(names) == 1 else 'them'}, so where that decision reads "
      f"{'it' if len(names) == 1 else 'them'}, blocks take the paths zeros take. Pass "
      f"{'an array for it' if len(names) == 1 else 'arrays for them'} to estimate the "
      "paths their values take."), where)
  return f", on zeros for the inputs given as shapes ({', '.join(names)})"


# A persistent kernel whose classes simulate at most this many iterations
# of its loop (a second or so) is estimated by them, exactly.
EXACT_ITERATIONS = 64


class Classes:
  """Chooses classes for one Executor's launches; each kernel's block paths
  are followed once (`paths`, shared with the Executors that time the same
  launch at other clocks)."""

  def __init__(self, options, timing, shapes_only=False, paths_cache=None):
    self.options, self.timing, self.shapes_only = options, timing, shapes_only
    # id(kernel jaxpr) -> (jaxpr, paths.Paths or the SliceError's words)
    self.paths = {} if paths_cache is None else paths_cache

  def choose(self, prep, launch, s):
    """({group: the first group of its class}, a note for the report, the
    blocks' paths.Paths or None), or (None, note, None) when every group
    must run. A class: groups whose blocks share their SMs alike
    (timing/model.py) and take the same path (every block's, in a kernel
    whose control flow is the same in every block; where it depends on the
    grid index, each block's decisions: blocks/paths.py)."""
    if not self.options.block_classes:
      return None, "", None
    groups, placement = s.groups, s.placement
    n = sum(map(len, groups))
    found = None
    if prep.variation is not None:
      why, where = prep.variation
      note = f"control flow depends on {why} ({where})"
      reads = self._known_reads(prep, launch) if why == block_classes.DATA else None
      if why == block_classes.GRID or reads is not None:
        found = self._block_paths(prep, launch, s, *(reads or (frozenset(), ())))
      if isinstance(found, str):
        note += f"; its paths were not followed ({found})"
      if not isinstance(found, paths.Paths):
        note += f": all {n} blocks simulated"
        if why == block_classes.DATA and self.shapes_only:
          note += _on_zeros(launch, where, prep.jaxpr)
        return None, note, None
      by = "by the path each block takes and blocks per SM"
      # (its decisions read only inputs whose values it has: known_reads)
      basis = ", on the values of the inputs it was given" if why == block_classes.DATA else ""
    else:
      note, by = "control flow is the same in every block", "by blocks per SM"
      basis = ""
    first: dict[Any, int] = {}
    out: dict[int, int] = {}
    for g, members in enumerate(groups):
      key = tuple((placement.share(number), found and found.key(number))
                  for number, _, _ in members)
      out[g] = first.setdefault(key, g)
    sims = sum(len(groups[g]) for g in set(first.values()))
    reps = [groups[g] for g in set(first.values())]
    by_iterations = self._by_iterations(found, launch, s, reps)
    if by_iterations is not None:
      return by_iterations[0], f"{note}: {by_iterations[1]}{basis}", found
    return out, (f"{note}: {len(first)} class(es) {by}, {sims} of {n} blocks "
                 f"simulated{basis}"), found

  def _by_iterations(self, found, launch, s, reps):
    """(an extrapolate.Plan, its words) where the blocks' persistent loop
    can be timed by its iterations and that simulates fewer of them than
    the classes' blocks (`reps`) would; else None."""
    if not isinstance(found, paths.Paths):
      return None
    plan = extrapolate.plan(found, s.groups, s.placement.share, launch.num_threads)
    if plan is None:
      return None
    # (the classes' times are the full simulation's to the last bit, the
    # iterations' sums only to rounding: those are taken where the classes
    # would simulate many iterations, and more)
    ran, total = plan.iterations
    by_classes = sum(len(found.iterations[m[0][0]].paths) + 1 for m in reps)
    if by_classes <= EXACT_ITERATIONS or ran + len(plan.runs) >= by_classes:
      return None
    kinds = len({p for it in found.iterations.values() for p in it.paths})
    return plan, (f"its persistent loop's {total} iterations over {len(s.blocks)} blocks "
                  f"take {kinds} path(s): {ran} iterations in {len(plan.runs)} blocks "
                  "simulated, every block's time summed from its iterations' "
                  "(execute/extrapolate.py)")

  def _known_reads(self, prep, launch):
    """For a kernel whose control flow reads memory: where every decision
    reads only inputs whose values this estimate has (arrays given,
    constants), the reads a slice may run (paths.known_reads); else None
    (its paths depend on values it does not have: every block runs), with
    the inputs they read."""
    if not self.shapes_only:
      known: Iterable[int] = range(launch.num_inputs)
    elif launch.unknown_inputs is None:
      return None
    else:
      known = [i for i in range(launch.num_inputs) if i not in launch.unknown_inputs]
    # (an input an output aliases may be written: its values are not known)
    known = frozenset(known) - {i for i, _ in launch.aliases}
    found = block_classes.analyse(prep.jaxpr, launch.grid_names, sizes=axis_sizes(launch),
                                  known_inputs=known)[0]
    if found is not None and found[0] == block_classes.DATA:
      return None
    return paths.known_reads(prep.jaxpr, known)

  def _block_paths(self, prep, launch, s, reads, inputs):
    """Every block's path (blocks/paths.py): a paths.Paths, or why there
    is none (words). Once per kernel jaxpr (and its launch's inputs, where
    the paths read them)."""
    # (paths that read inputs hold for those values: keyed by their digest)
    key = (id(prep.jaxpr),) + tuple(
        hashlib.sha1(np.ascontiguousarray(s.in_bufs[i].data)).hexdigest()
        for i in sorted(inputs))
    hit = self.paths.get(key)
    if hit is not None and hit[0] is prep.jaxpr:
      return hit[1]
    try:
      keep = paths.kernel_slice(prep.jaxpr, reads)
      loop = paths.persistent_loop(prep.jaxpr, keep)
      if loop is not None and (launch.num_threads or 1) != 1:
        loop = None  # (each thread's loop would be its own: not followed apart)
      cx = Compiler(self.timing, launch, self.options.max_cycles, numerics=False,
                    keep=keep, overrides=paths.overrides(loop), sites=prep.sites,
                    wrap=paths.lanes_checked)
      sliced = copy.copy(prep)
      sliced.program = cx.compile(prep.jaxpr)
      found = paths.follow(
          lambda placement: GroupRunner(sliced, s.in_bufs + s.out_bufs, launch,
                                        self.timing, placement,
                                        races.RaceLog(launch.name),
                                        RunChecks(group_size=max(map(len, s.groups)))),
          s.groups, launch, prep.jaxpr)
      found.loop = loop
    except Exception as e:  # (then every block runs, as before; the note says why)
      if isinstance(e, KeyboardInterrupt):
        raise
      found = (f"{type(e).__name__}: " if not isinstance(e, paths.SliceError) else ""
               ) + (str(e).splitlines() or [""])[0]
    self.paths[key] = (prep.jaxpr, found)
    return found
