"""Where the operands of the async primitives lie in their equations: the
refs they use, the leaves of those refs' transforms, a barrier, a user's
predicate. Each layout is decoded here once, for the rules
(interpret/rules/tma.py, barriers.py, wgmma.py) and the analyses
(blocks/block_classes.py, blocks/paths.py) alike. Positions count the
equation's operands (eqn.invars; a rule's function gets them in order)."""
import dataclasses

from pallas_sim.backends.sim.base import jax_internals as jx
from pallas_sim.backends.sim.interpret import refview


@dataclasses.dataclass(frozen=True, slots=True)
class RefOperand:
  """A ref operand: the ref at `index`, its transforms' treedef `tree`
  (None: none) and their leaves at the positions `leaves`."""
  index: int
  tree: object
  leaves: slice

  @property
  def count(self):
    """How many leaves its transforms have."""
    return self.leaves.stop - self.leaves.start


def _refs(params, refs, first):
  """RefOperands for (ref position, its treedef's parameter) pairs whose
  leaves follow one another from position `first`; and the position after
  the last leaf."""
  out, at = [], first
  for index, key in refs:
    tree = params[key]
    n = refview.num_leaves(tree)
    out.append(RefOperand(index, tree, slice(at, at + n)))
    at += n
  return out, at


def _predicate(eqn, at):
  """The position of a copy's predicate operand, or None without one."""
  return at if jx.param(eqn, "has_user_predicate") else None


def _barrier_predicate(eqn, at):
  """barrier_arrive binds has_user_predicate (every release of the window);
  a wait, a test and arrive_and_wait take no predicate."""
  return _predicate(eqn, at) if jx.primitive_name(eqn) == "barrier_arrive" else None


@dataclasses.dataclass(frozen=True, slots=True)
class TmaLoad:
  """copy_gmem_to_smem(src, dst, [barrier,] *src leaves, *dst leaves,
  *barrier leaves, [predicate]): `barrier` None where it has none (the
  pre-Hopper copy)."""
  src: RefOperand
  dst: RefOperand
  barrier: RefOperand | None
  predicate: int | None


def tma_load(eqn):
  p = eqn.params
  has_barrier = jx.param(eqn, "has_barrier")
  pairs = [(0, "src_transforms_treedef"), (1, "dst_transforms_treedef")]
  if has_barrier:
    pairs.append((2, "barrier_transforms_treedef"))
  refs, end = _refs(p, pairs, len(pairs))
  return TmaLoad(refs[0], refs[1], refs[2] if has_barrier else None,
                 _predicate(eqn, end))


@dataclasses.dataclass(frozen=True, slots=True)
class TmaStore:
  """copy_smem_to_gmem(src, dst, *src leaves, *dst leaves, [predicate])."""
  src: RefOperand
  dst: RefOperand
  predicate: int | None


def tma_store(eqn):
  p = eqn.params
  (src, dst), end = _refs(p, [(0, "src_transforms_treedef"),
                              (1, "dst_transforms_treedef")], 2)
  return TmaStore(src, dst, _predicate(eqn, end))


@dataclasses.dataclass(frozen=True, slots=True)
class AsyncStoreSmem:
  """async_store_smem(value, ref, barrier, cluster index, *ref leaves,
  *barrier leaves)."""
  value: int
  ref: RefOperand
  barrier: RefOperand
  cluster_index: int


def async_store_smem(eqn):
  (ref, barrier), _ = _refs(eqn.params, [(1, "ref_transforms_treedef"),
                                         (2, "barrier_transforms_treedef")], 4)
  return AsyncStoreSmem(0, ref, barrier, 3)


@dataclasses.dataclass(frozen=True, slots=True)
class BarrierUse:
  """barrier_arrive, barrier_wait, barrier_test, barrier_arrive_and_wait:
  (barrier, *its leaves, [predicate])."""
  barrier: RefOperand
  predicate: int | None


def barrier_use(eqn):
  p = eqn.params
  (barrier,), end = _refs(p, [(0, "transforms_treedef")], 1)
  return BarrierUse(barrier, _barrier_predicate(eqn, end))


@dataclasses.dataclass(frozen=True, slots=True)
class Wgmma:
  """wgmma_ref(acc, a, b, *acc leaves, *a leaves, *b leaves): `a` in SMEM,
  or registers (a value, with no transforms)."""
  acc: RefOperand
  a: RefOperand
  b: RefOperand


def wgmma(eqn):
  (acc, a, b), _ = _refs(eqn.params, [(0, "acc_transforms_tree"), (1, "a_transforms_tree"),
                                      (2, "b_transforms_tree")], 3)
  return Wgmma(acc, a, b)
