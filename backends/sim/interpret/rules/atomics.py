"""Atomic stores: `plgpu.atomic_add/max/min/and/or/xor` (mgpu_atomic_store),
element-wise read-modify-writes of SMEM or GMEM (a cluster peer's SMEM
through `plgpu.cluster_ref` too).

Each element is updated atomically (int32 max/min as unsigned, as the
lowering emits them), in the order the simulated threads issue them (on the GPU that order varies from run to run: float sums may
differ in their last bits). For race detection an atomic update is a write
that does not race with other atomic updates, but does with plain accesses
that are not ordered with it.
"""
from collections.abc import Callable
from typing import Any

import numpy as np
from jax import tree_util

from pallas_sim.backends.sim.interpret import refview
from pallas_sim.backends.sim.interpret.compiler import rule
from pallas_sim.errors import KernelError

class unsigned:  # noqa: N801 (used as a function; a class so that it pickles)
  """f on the unsigned view of signed integers (umin/umax)."""

  def __init__(self, f):
    self.f = f

  def __call__(self, a, b):
    if a.dtype.kind != "i":
      return self.f(a, b)
    u = np.dtype(f"u{a.dtype.itemsize}")
    return self.f(a.view(u), np.asarray(b, a.dtype).view(u)).view(a.dtype)


# int32 max and min compare as unsigned: the lowering (jax 0.11.2) emits
# u32 atomics for them (measured on an H200: benchmarks/atomic_probe.py).
OPS: dict[str, Callable[..., Any]] = {  # (also async_store_smem's, interpret/rules/tma.py)
    "add": np.add, "max": unsigned(np.maximum), "min": unsigned(np.minimum),
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
}


@rule("mgpu_atomic_store")
def _atomic_store(eqn, cx):
  tree = eqn.params["args_tree"]
  kind = eqn.params["atomic_type"].value
  op = OPS[kind]
  where = cx.where(eqn)
  prim = f"atomic_{kind}"

  def atomic(wg, *operands):
    ref, transforms, val = tree_util.tree_unflatten(tree, operands)
    r = refview.apply(ref, transforms or (), wg)
    view = r.view
    if view.shape != np.shape(val):
      raise KernelError(f"{prim}: value of shape {np.shape(val)} into a ref of "
                        f"shape {view.shape}")
    blk = wg.block
    blk.hb.plain(wg, r, True, prim, where, atomic=True)
    blk.group.read(r, "thread", prim, where, wg.index, blk, replayed=True)
    val = np.asarray(val, view.dtype)
    view[...] = op(view, val)
    blk.group.wrote(r, op, val)
    return []
  return atomic
