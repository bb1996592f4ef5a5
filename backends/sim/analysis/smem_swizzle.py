"""The swizzle the Mosaic GPU lowering gives SMEM that a kernel leaves
untransformed.

Under its default lowering semantics (Warpgroup: CompilerParams'
lowering_semantics), the lowering infers transforms for SMEM allocations that
have none (jax/experimental/mosaic/gpu/layout_inference.py). A wgmma operand
in SMEM must be tiled (8, swizzle / itemsize) and swizzled 128, 64 or 32
bytes, and a wgmma's lhs and rhs get the same transforms (an equality
constraint). So an untransformed pair gets the largest swizzle whose tile
divides both. A TMA copy into such a buffer moves rows no wider than the
swizzle: the quickstart's B tile of 128 f16 columns, 256-byte rows as
written, moves in 32-byte rows when its K tile is 16, because A's (128, 16)
tile allows no wider swizzle (H200: one L2 request a 32-byte sector,
Nsight Compute, benchmarks/RESULTS.md).

Values never depend on this (the simulator keeps logical contents); the
timing model does (timing/model.py Timing.tma, by the box's row bytes).
What is not modelled: the lowering may also conjure transforms for other
untransformed SMEM refs (its largest swizzle dividing the minor dimension;
not checked on the GPU for refs that only TMA copies touch). The model reads
those refs' rows as written. That differs where the minor dimension is a
multiple of 32 or 64 bytes but not of 128 and wider than the swizzle
(96, 160, 192 bytes...): there the GPU's rows would be 32 or 64 bytes.
"""
import numpy as np
from jax.extend import core as jax_extend_core

from pallas_sim.backends.sim.analysis.resources import inner, sub_jaxprs

SWIZZLES = (128, 64, 32)
_WGMMA = ("wgmma_ref", "wgmma")


def _is_smem(v):
  aval = getattr(v, "aval", None)
  return hasattr(aval, "inner_aval") and str(getattr(aval, "memory_space", "")) == "smem"


class _Classes:
  """Union-find over allocations (run_scoped invars) that wgmmas tie."""

  def __init__(self):
    self.parent = {}
    self.operand = set()  # allocations a wgmma reads

  def find(self, v):
    while self.parent.get(v, v) is not v:
      v = self.parent[v]
    return v

  def union(self, a, b):
    ra, rb = self.find(a), self.find(b)
    if ra is not rb:
      self.parent[ra] = rb


def infer(kernel_jaxpr, lane_semantics=False):
  """Allocation var (a run_scoped invar) -> the swizzle in bytes that the
  lowering gives it, for every allocation a wgmma reads (one the kernel
  tiles itself keeps its own rows). Empty under Lane semantics, which
  infers nothing."""
  if lane_semantics:
    return {}
  cls = _Classes()
  _walk(kernel_jaxpr, {}, cls)
  groups = {}
  for v in cls.operand:
    groups.setdefault(cls.find(v), []).append(v)
  out = {}
  for members in groups.values():
    sw = next((s for s in SWIZZLES if all(_fits(v, s) for v in members)), None)
    if sw:
      out.update((v, sw) for v in members)
  return out


def _fits(v, swizzle):
  """Whether the (8, swizzle / itemsize) tile divides the allocation's two
  minor dimensions (its layout in memory: a transposed view keeps it). An
  allocation the kernel tiles itself has its tiled shape, whose minor
  dimension is its swizzle: its partner gets that (a buffer with a tiling
  of its own keeps its rows: interpret/rules/tma.py _row_bytes)."""
  ref = v.aval.inner_aval
  shape, dtype = getattr(ref, "shape", ()), getattr(ref, "dtype", None)
  if len(shape) < 2 or dtype is None:  # (a barrier, a union of refs: no swizzle)
    return False
  itemsize = np.dtype(dtype).itemsize
  return shape[-2] % 8 == 0 and (shape[-1] * itemsize) % swizzle == 0


def _walk(jaxpr, env, cls):
  """env: this jaxpr's vars -> the allocation each ref names."""
  get = lambda v: None if isinstance(v, jax_extend_core.Literal) else env.get(v)
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    ins = [get(v) for v in eqn.invars]
    p = eqn.params
    if name == "run_scoped":
      sub = p["jaxpr"]
      scope = dict(zip(sub.constvars, ins))
      scope.update((v, v) for v in sub.invars if _is_smem(v))
      _walk(sub, scope, cls)
    elif name in _WGMMA:
      a, b = ins[1], ins[2]
      for x in (a, b):
        if x is not None:
          cls.operand.add(x)
      if a is not None and b is not None:
        cls.union(a, b)
    elif name == "while":
      cn, bn = p["cond_nconsts"], p["body_nconsts"]
      body = inner(p["body_jaxpr"])
      _walk(body, _bind(body, ins[cn:]), cls)
    elif name == "cond":
      for branch in map(inner, p["branches"]):
        _walk(branch, _bind(branch, ins[1:]), cls)
    else:
      for sub in (s for v in p.values() for s in sub_jaxprs(v)):
        _walk(sub, _bind(sub, ins), cls)


def _bind(sub, ins):
  """A nested jaxpr's inputs by position, where their counts agree (a call,
  a loop's body, a core or warp map); refs passed another way are not
  followed (their buffers keep the rows they are written with)."""
  names = list(sub.invars)
  if len(ins) != len(names):
    names = list(sub.constvars) + names
  if len(ins) != len(names):
    return {}
  return {v: a for v, a in zip(names, ins) if a is not None}
