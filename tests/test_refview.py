"""Ref transforms: a chain decoded once (refview.compile_transforms' fast
path for indexers with dynamic starts, taken where refview.index_plans
gives the chain's plans) names the same elements, and fails with the same
errors, as JAX's own indexer objects rebuilt at every call."""
import numpy as np
from hypothesis import given, settings, strategies as st
from jax import tree_util
from jax._src.state import indexing as jax_indexing

from pallas_sim.backends.sim.interpret import refview
from pallas_sim.backends.sim.machine import memory
from pallas_sim.errors import OutOfBoundsError

SHAPE = (6, 8, 10)


def _buf():
  data = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
  return memory.Buffer("x", "gmem", data)


@st.composite
def chains(draw):
  """One or two NDIndexers over SHAPE: per axis a slice (start static or
  dynamic, possibly out of bounds) or an integer (static or dynamic)."""
  shape, out = SHAPE, []
  for _ in range(draw(st.integers(1, 2))):
    idx = []
    for n in shape:
      dynamic = draw(st.booleans())
      if draw(st.booleans()):
        size = draw(st.integers(1, n))
        start = draw(st.integers(0, n))  # (n - size + 1 .. n: out of bounds)
        idx.append(jax_indexing.Slice(np.int32(start) if dynamic else start, size))
      else:
        i = draw(st.integers(0, n))
        idx.append(np.int32(i) if dynamic else i)
    ind = jax_indexing.NDIndexer(tuple(idx), shape, ())
    out.append(ind)
    shape = tuple(s.size for s in idx if isinstance(s, jax_indexing.Slice))
    if not shape:
      break
  return tuple(out)


def _outcome(f):
  try:
    r = f()
  except OutOfBoundsError as e:
    return ("error", str(e))
  return ("view", r.view.shape, r.view.tolist(), r.view.__array_interface__["data"][0])


@settings(max_examples=300, deadline=None)
@given(chains())
def test_a_compiled_chain_names_what_jax_indexers_name(trs):
  buf = _buf()
  leaves, treedef = tree_util.tree_flatten(trs)
  root = refview.root_ref(buf)
  slow = _outcome(lambda: refview.apply(root, refview.unflatten(treedef, leaves)))
  fast = _outcome(lambda: refview.compile_transforms(treedef)(root, leaves))
  assert fast == slow
  if treedef.num_leaves:
    assert refview.index_plans(treedef) is not None  # (the fast path was taken)
  clipped_slow = refview.apply_clipped(root, refview.unflatten(treedef, leaves)) \
      if slow[0] == "view" else None
  if clipped_slow is not None:
    r, shape, inb = refview.compile_clipped(treedef)(root, leaves)
    assert (r.view.tolist(), shape, inb) == (clipped_slow[0].view.tolist(),
                                             clipped_slow[1], clipped_slow[2])
