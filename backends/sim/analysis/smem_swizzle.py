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
Nsight Compute, benchmarks/HISTORY.md).

Values never depend on this (the simulator keeps logical contents); the
timing model does (timing/model.py Timing.tma, by the box's row bytes).
What is not modelled: the lowering may also conjure transforms for other
untransformed SMEM refs (its largest swizzle dividing the minor dimension;
not checked on the GPU for refs that only TMA copies touch). The model reads
those refs' rows as written. That differs where the minor dimension is a
multiple of 32 or 64 bytes but not of 128 and wider than the swizzle
(96, 160, 192 bytes...): there the GPU's rows would be 32 or 64 bytes.
"""
from typing import Any

import numpy as np

from pallas_sim.backends.sim.analysis import given_layouts

SWIZZLES = (128, 64, 32)
_WGMMA = ("wgmma_ref", "wgmma")


def infer(kernel_jaxpr, lane_semantics=False):
  """One walk of the kernel for its allocations: (allocation var (a
  run_scoped invar) -> the swizzle in bytes that the lowering gives it, for
  every allocation a wgmma reads (one the kernel tiles itself keeps its own
  rows); and given_layouts.Allocations.at, the layouts the kernel gives). The
  swizzles are empty under Lane semantics, which infers nothing."""
  cls = _Operands()
  cls.walk(kernel_jaxpr, [])
  if lane_semantics:
    return {}, cls.at
  groups: dict[Any, list[Any]] = {}
  for v in cls.operand:
    groups.setdefault(cls.find(v), []).append(v)
  out: dict[Any, int] = {}
  for members in groups.values():
    sw = next((s for s in SWIZZLES if all(_fits(v, s, cls.layouts) for v in members)), None)
    if sw:
      out.update((v, sw) for v in members)
  return out, cls.at


def _fits(v, swizzle, layouts):
  """Whether the (8, swizzle / itemsize) tile divides the allocation's two
  minor dimensions (its layout in memory: a transposed view keeps it). An
  allocation the kernel tiles itself has its tiled shape, whose minor
  dimension is its swizzle (or, from jax 0.12.1, a logical shape and its
  given swizzle): its partner gets that (a buffer with a tiling of its own
  keeps its rows: interpret/rules/tma.py _row_bytes)."""
  own = layouts.get(v)
  if own is not None and own[1] is not None:
    return own[1] % swizzle == 0
  ref = v.aval.inner_aval
  shape: tuple[int, ...] = getattr(ref, "shape", ())
  dtype = getattr(ref, "dtype", None)
  if len(shape) < 2 or dtype is None:  # (a barrier, a union of refs: no swizzle)
    return False
  itemsize = np.dtype(dtype).itemsize
  return shape[-2] % 8 == 0 and (shape[-1] * itemsize) % swizzle == 0


class _Operands(given_layouts.Allocations):
  """The allocations wgmmas read, in classes (union-find) that a wgmma
  reading two of them ties."""

  def __init__(self):
    super().__init__()
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

  def seen(self, eqn, ins):
    super().seen(eqn, ins)
    if eqn.primitive.name in _WGMMA:
      a, b = ins[1], ins[2]
      for x in (a, b):
        if x is not None:
          self.operand.add(x)
      if a is not None and b is not None:
        self.union(a, b)
