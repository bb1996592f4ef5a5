"""The path each block takes, for ps.estimate of a kernel whose control flow
depends on the grid index (a persistent kernel's loop over tiles, causal
attention's loop bound): blocks that take the same path, sharing their SMs
alike, take the same time, so one of them is simulated for all.

A block's path is read off the kernel, not guessed: the kernel's jaxpr is
sliced down to what its control decisions (cond branches, while loops,
pl.delay, a copy's predicate) and its TMA loads' addresses depend on, and
that slice runs for every block with the simulator's own rules (integer
index math, no data, no waits): a few equations a block where the full
simulation runs thousands. It gives each block its decisions (the classes)
and the source of every TMA load it issues, for the L2 model's trace of the
launch (machine/timing.py, hbm_reads_traced): a block not simulated takes
its class's issue cycles, load for load.

Where the slice would need a value read from memory, or a primitive it does
not know to be pure, there is no slice (`SliceError`) and every block is
simulated, as before."""
import collections

from jax.extend import core as jax_extend_core

from pallas_sim.backends.sim import refview
from pallas_sim.backends.sim.resources import inner, sub_jaxprs
from pallas_sim.errors import SimError


class SliceError(Exception):
  """The kernel cannot be sliced: why, in words."""


# Primitives whose bodies just run (their jaxpr's inputs are the equation's,
# by position).
CALLS = frozenset(("pjit", "jit", "closed_call", "core_call", "custom_jvp_call",
                   "custom_vjp_call", "checkpoint", "remat"))
# Equations that do something besides giving values: never in a slice as values.
EFFECTS = frozenset(("delay", "debug_print", "debug_callback"))


def _is_ref(v):
  return hasattr(v.aval, "inner_aval")


def kernel_slice(jaxpr):
  """{id(equation): which of its operands the slice needs} for the
  equations of `jaxpr` (nested ones included) that the kernel's control
  decisions and TMA load addresses depend on. Raises SliceError where one
  depends on something a slice cannot compute."""
  keep = {}
  _need(jaxpr, [False] * len(jaxpr.outvars), keep)
  return keep


def _need(jaxpr, out_need, keep):
  """Marks in `keep` the equations of `jaxpr` needed for its outputs where
  out_need says so, and for every decision and load inside it; returns,
  for its constvars then its invars, whether each is needed, and whether
  any of its equations is."""
  need = {v for v, n in zip(jaxpr.outvars, out_need)
          if n and not isinstance(v, jax_extend_core.Literal)}
  kept = False
  for eqn in reversed(jaxpr.eqns):
    outs = [v in need for v in eqn.outvars]
    ins = _eqn(eqn, outs, keep)
    if ins is None:
      continue
    prev = keep.get(id(eqn))  # (a loop's body is sliced again as its needs grow)
    keep[id(eqn)] = ins if prev is None else _any(prev, ins)
    kept = True
    for v, n in zip(eqn.invars, ins):
      if n and not isinstance(v, jax_extend_core.Literal):
        need.add(v)
  return [v in need for v in list(jaxpr.constvars) + list(jaxpr.invars)], kept


def _sub(jaxpr, out_need, keep, consts=False):
  """_need of a nested jaxpr whose inputs are the equation's operands (its
  invars; its constvars where `consts`, a run_scoped body's): the need of
  each operand, and whether anything inside is kept."""
  flags, kept = _need(jaxpr, out_need, keep)
  nc = len(jaxpr.constvars)
  return (flags[:nc] if consts else flags[nc:]), kept


def _any(*lists):
  return [any(t) for t in zip(*lists)]


def _eqn(eqn, outs, keep):
  """Whether each operand of `eqn` is needed, or None when eqn is not."""
  name = eqn.primitive.name
  p = eqn.params
  n = len(eqn.invars)
  if name == "cond":  # (a decision: which branch's work the block does)
    ins = [False] * (n - 1)
    for b in p["branches"]:
      ins = _any(ins, _sub(inner(b), outs, keep)[0])
    return [True] + ins
  if name == "while":
    return _while(eqn, outs, keep)
  if name == "scan":
    return _scan(eqn, outs, keep)
  if name == "copy_gmem_to_smem":
    # (its source and destination with their indices: a multicast's part
    # depends on the destination's box; the barrier does not matter)
    ns = refview.num_leaves(p["src_transforms_treedef"])
    nd = refview.num_leaves(p["dst_transforms_treedef"])
    nb = refview.num_leaves(p["barrier_transforms_treedef"])
    ins = [True, True, False] + [True] * (ns + nd) + [False] * nb
    return ins + [True] * (n - len(ins))  # (the predicate, if any)
  if name == "copy_smem_to_gmem":  # (its destination: a box past the ends is cut)
    return [False, True] + [True] * (n - 2)
  if name == "delay":
    return [True] * n
  if name == "run_state":
    return _run_state(eqn, outs, keep)
  if name == "get" and eqn.invars[0] in _BOXES[-1]:
    return [True] * n if any(outs) else None
  subs = [sub for v in p.values() for sub in sub_jaxprs(v)]
  if name == "run_scoped" or name in CALLS:
    if len(subs) != 1:
      raise SliceError(f"'{name}' with {len(subs)} bodies")
    flags, kept = _sub(subs[0], outs, keep, consts=name == "run_scoped")
    if len(flags) != n:
      raise SliceError(f"'{name}' whose body does not take its operands")
    return flags if kept or any(outs) else None
  if subs:  # (core maps, warp maps...: left out only where nothing inside matters)
    for sub in subs:
      _, kept = _sub(sub, [False] * len(sub.outvars), keep)
      if kept or any(outs):
        raise SliceError(f"a decision or a TMA load inside '{name}'")
  if not any(outs):
    return None
  if name in EFFECTS or any(_is_ref(v) for v in list(eqn.invars) + list(eqn.outvars)):
    raise SliceError(f"a decision or a TMA load address depends on '{name}'")
  return [True] * n


def _while(eqn, outs, keep):
  p = eqn.params
  cn, bn = p["cond_nconsts"], p["body_nconsts"]
  cond, body = inner(p["cond_jaxpr"]), inner(p["body_jaxpr"])
  carry = list(outs)
  flags, _ = _sub(body, carry, keep)
  cflags, _ = _sub(cond, [True], keep)  # (its trip count is a decision)
  bflags = flags
  while True:
    grown = _any(carry, cflags[cn:], bflags[bn:])
    if grown == carry:
      break
    carry = grown
    bflags, _ = _sub(body, carry, keep)
  return cflags[:cn] + bflags[:bn] + carry


# Per run_state body being sliced: its refs that box a value the body only
# reads (a read of one is the value given: the slice may need it).
_BOXES = [frozenset()]


def _run_state(eqn, outs, keep):
  """pl.run_state: its body's refs box the operands (refs pass through);
  a value it only reads may be in the slice, through its reads."""
  sub = inner(eqn.params["jaxpr"])
  if any(outs) or not all(eqn.params["is_initialized"]):
    if any(outs) or _need(sub, [False] * len(sub.outvars), keep)[1]:
      raise SliceError("a decision or a TMA load depends on what a run_state "
                       "returns")
    return None
  uses = collections.defaultdict(set)
  for e in sub.eqns:
    for v in e.invars:
      if not isinstance(v, jax_extend_core.Literal):
        uses[v].add(e.primitive.name)
  _BOXES.append(frozenset(v for v, o in zip(sub.invars, eqn.invars)
                          if not _is_ref(o) and uses[v] <= {"get"}))
  try:
    flags, kept = _sub(sub, [False] * len(sub.outvars), keep)
  finally:
    _BOXES.pop()
  return flags if kept else None


def _scan(eqn, outs, keep):
  p = eqn.params
  body = inner(p["jaxpr"])
  consts_i, carry_i, _ = p["ft_in"].update(list(range(len(eqn.invars)))).unpack()
  nc, ncar = len(list(consts_i)), len(list(carry_i))
  n = len(eqn.invars)
  carry = list(outs[:ncar])
  flags, kept = _sub(body, carry + list(outs[ncar:]), keep)
  if not kept and not any(outs):
    return None
  while True:
    grown = _any(carry, flags[nc:nc + ncar])
    if grown == carry:
      break
    carry = grown
    flags, _ = _sub(body, carry + list(outs[ncar:]), keep)
  return flags[:nc] + _any(carry, flags[nc:nc + ncar]) + flags[nc + ncar:]


# --- running the slice --------------------------------------------------

# The slice's own rules for what it records (the others are the
# simulator's): decisions go to the block's path, loads to its loads, as
# (thread, site, source key, bytes), in each thread's program order.
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


def _decided(wg, value):
  path = wg.block.engines.path
  path.append(value)
  if len(path) > MAX_DECISIONS:
    raise TooLong(f"a block's path runs past {MAX_DECISIONS} decisions")


@_override("cond")
def _cond(eqn, cx):
  from pallas_sim.backends.sim.interpret import run_plain
  branches = [cx.compile(b) for b in eqn.params["branches"]]
  last = len(branches) - 1

  def cond(wg, i, *args):
    i = min(max(int(i), 0), last)
    _decided(wg, i)
    return run_plain(branches[i], list(args), wg)
  return cond


@_override("while")
def _while_rule(eqn, cx):
  from pallas_sim.backends.sim.interpret import run_plain
  p = eqn.params
  cond, body = cx.compile(p["cond_jaxpr"]), cx.compile(p["body_jaxpr"])
  cn, bn = p["cond_nconsts"], p["body_nconsts"]

  def loop(wg, *args):
    cc, bc, carry = list(args[:cn]), list(args[cn:cn + bn]), list(args[cn + bn:])
    trips = 0
    while run_plain(cond, cc + carry, wg)[0]:
      carry = run_plain(body, bc + carry, wg)
      trips += 1
      if trips > MAX_DECISIONS:
        raise TooLong(f"a loop runs past {MAX_DECISIONS} iterations")
    _decided(wg, ("trips", trips))
    return carry
  return loop


@_override("delay")
def _delay(eqn, cx):
  def delay(wg, nanos):
    _decided(wg, ("delay", float(nanos)))
    return []
  return delay


@_override("copy_gmem_to_smem")
def _load(eqn, cx):
  from pallas_sim.backends.sim.rules import tma
  p = eqn.params
  src_at = refview.compile_clipped(p["src_transforms_treedef"])
  dst_at = refview.compile_transforms(p["dst_transforms_treedef"])
  ns = refview.num_leaves(p["src_transforms_treedef"])
  nd = refview.num_leaves(p["dst_transforms_treedef"])
  nb = refview.num_leaves(p["barrier_transforms_treedef"])
  collective = tuple(p.get("collective_axes") or ())
  has_pred = p.get("has_user_predicate", False)
  site = cx.site(eqn)
  # (source, its indices) -> (key, bytes): blocks load the same tiles over
  # and over (a matmul's), and a box's view costs ~20 us to build
  seen = {}

  def load(wg, src, dst, bar, *leaves):
    pred = bool(leaves[ns + nd + nb]) if has_pred else True
    if has_pred:
      _decided(wg, pred)
    if not pred:
      return []
    blk = wg.block
    if collective:
      s, _, _ = src_at(src, leaves[:ns])
      d = dst_at(dst, leaves[ns:ns + nd])
      peers = blk.group.peers(blk, collective)
      s, _ = tma.partition(s, d, peers.index(blk), len(peers))
      got = tma.source_key(s), s.view.nbytes
    else:
      at = (id(src.view), tuple(int(i) for i in leaves[:ns]))
      hit = seen.get(at)
      if hit is None or hit[0] is not src.view:  # (it holds the view: ids stay apart)
        s, _, inb = src_at(src, leaves[:ns])
        hit = seen[at] = (src.view, tma.source_key(s), s.view.nbytes, inb is not None)
      got = hit[1:3]
      if hit[3]:  # (a box cut at the array's ends moves fewer bytes)
        _decided(wg, ("cut", site, got[1]))
    blk.engines.loads.append((wg.index, site) + got)
    return []
  return load


@_override("copy_smem_to_gmem")
def _store(eqn, cx):
  p = eqn.params
  dst_at = refview.compile_clipped(p["dst_transforms_treedef"])
  ns = refview.num_leaves(p["src_transforms_treedef"])
  nd = refview.num_leaves(p["dst_transforms_treedef"])
  has_pred = p.get("has_user_predicate", False)

  def store(wg, src, dst, *leaves):
    if has_pred:
      _decided(wg, bool(leaves[ns + nd]))
    d, _, inb = dst_at(dst, leaves[ns:ns + nd])
    if inb is not None:
      _decided(wg, ("cut", d.view.shape))
    return []
  return store


class Paths:
  """Every block's path and loads (`run`), and from them the classes."""

  def __init__(self, decisions, loads):
    self.decisions = decisions  # block number -> tuple of its decisions
    self.loads = loads          # block number -> [(thread, site, key, bytes)]

  def key(self, number):
    return self.decisions[number]

  def joined(self, number, rep_events):
    """Block `number`'s loads at the issue cycles of its class's simulated
    block (`rep_events`: its (cycle, key, bytes, thread, site), as the TMA
    rule traced them): load for load, per thread and site in order."""
    cycles = collections.defaultdict(list)
    for ev in rep_events:
      cycles[ev[3], ev[4]].append(ev[0])
    seen = collections.Counter()
    out = []
    for thread, site, key, nbytes in self.loads[number]:
      k = seen[thread, site]
      seen[thread, site] += 1
      out.append((cycles[thread, site][k], key, nbytes, thread, site))
    if sum(seen.values()) != len(rep_events):
      raise SimError(f"block {number}'s path issues {sum(seen.values())} TMA loads, "
                     f"its class's simulated block {len(rep_events)}")
    return out


class Recording:
  """A launch placement for the slice's run: engines that record the
  block's path and loads (its timing is not used)."""

  def engines(self, number):
    from pallas_sim.backends.sim.machine.timing import Engines
    e = Engines(loads=True)
    e.path = []
    return e
