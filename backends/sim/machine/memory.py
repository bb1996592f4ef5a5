"""Buffers of GMEM, SMEM and accumulators, and the barrier objects in SMEM."""
import contextlib
import math
import mmap
from typing import Any

import numpy as np

SPACES = ("gmem", "smem", "regs", "sem")


def is_float(dtype):
  """numpy floats and ml_dtypes' (bfloat16, float8_*: numpy kind 'V')."""
  dtype = np.dtype(dtype)
  return dtype.kind == "f" or (dtype.kind == "V" and "float" in dtype.name)


def base_pages(shape, dtype):
  """Zeros whose pages are mapped on first touch, one base page at a time.
  numpy asks for transparent huge pages above 4 MiB, which cost twice:
  * a touch after races.release() zeroes a whole 2 MiB page (a 128x128
    tile's write to a 1024x1024 output's shadow cost 0.5 ms, not 20 us);
  * an array written both by forked workers and by the parent after the
    fork (an output, its written-mask) counts its huge pages as private to
    each worker (at 4096^3 on 8 workers, 13-14 MiB of a 16 MiB mask each,
    against 4-8 in base pages)."""
  dtype = np.dtype(dtype)
  nbytes = math.prod(np.atleast_1d(shape)) * dtype.itemsize  # (a shape or a length)
  if nbytes < _HUGE or _NOHUGE is None:
    return np.zeros(shape, dtype)
  # (private: shared anonymous memory would be one array for every forked
  # worker, and MADV_DONTNEED would not zero it)
  mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
  mm.madvise(_NOHUGE)
  return np.frombuffer(mm, dtype).reshape(shape)


_HUGE = 1 << 21
_NOHUGE = getattr(mmap, "MADV_NOHUGEPAGE", None)


def copy(a):
  """A writable copy of `a`, in base pages."""
  out = base_pages(np.shape(a), np.asarray(a).dtype)
  np.copyto(out, a)
  return out


# Where set (other_garbage), uninitialized memory holds bits drawn from it
# instead of NaN and sentinels.
_garbage: list[Any] = []


@contextlib.contextmanager
def other_garbage(seed):
  """Inside, uninitialized memory holds seeded random bits: a second run
  tells whether what a kernel read uninitialized reaches its outputs."""
  _garbage.append(np.random.default_rng(seed))
  try:
    yield
  finally:
    _garbage.pop()


def poison(shape, dtype):
  """Uninitialized memory: NaN for floats, an unlikely sentinel for ints, so a
  kernel that reads too early gets garbage, not a lucky right answer."""
  dtype = np.dtype(dtype)
  out = base_pages(tuple(shape), dtype)
  if _garbage and dtype.kind != "O":
    bits = _garbage[-1].integers(0, 256, out.nbytes, np.uint8)
    out.reshape(-1).view(np.uint8)[...] = bits
    if dtype.kind == "b":
      out.view(np.uint8)[...] &= 1
    return out
  if is_float(dtype):
    out[...] = np.nan
  elif dtype.kind == "b":
    out[...] = True
  elif dtype.kind in "iu":
    info = np.iinfo(dtype)  # (int8: the sentinel must fit in one byte)
    out[...] = (info.min + (0x5A5A if dtype.itemsize > 1 else 0x5A)
                if dtype.kind == "i" else info.max - 0x5A)
  return out


def wrote_read_only(exc):
  """Whether exc (or what caused it: rules wrap what they raise) is numpy
  refusing a write into a read-only array, such as an input lent by the
  callback (execute/buffers.py); from a worker, only its text came back."""
  seen = set()
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    if "read-only" in str(exc) and (isinstance(exc, ValueError) or "ValueError" in str(exc)):
      return True
    exc = exc.__cause__ or exc.__context__
  return False


class Buffer:
  """One allocation. `data` holds the logical (untiled) contents; `tiling` and
  `swizzle` record the physical layout the lowering would use."""
  __slots__ = ("name", "space", "data", "tiling", "swizzle", "nbytes", "shadow",
               "alloc_key", "_origin", "written", "unwritten", "_addr", "aliases",
               "smem_range", "packed", "lent", "inferred_swizzle", "members")

  def __init__(self, name, space, data, tiling=None, swizzle=None, alloc_key=None,
               origin=None):
    self.name = name
    self.space = space
    self.data = data
    self.tiling = tiling
    self.swizzle = swizzle
    self.shadow = None  # race detection's per-element history (checks/races.py)
    self.alloc_key = alloc_key  # which allocation made it, in every block
    self._origin = origin  # a group's private copy of a GMEM buffer: whose
    self.written = None  # uninitialized-memory check's mask (checks/initcheck.py)
    self.unwritten = 0
    self._addr = None
    self.aliases = None  # a RefUnion's byte tags (machine/aliasing.py)
    self.smem_range = None  # SMEM bytes [start, end) of a run_scoped allocation
    # the swizzle the lowering infers for it, untransformed (analysis/smem_swizzle.py)
    self.inferred_swizzle = None
    self.packed = None  # a RefUnion's 4-bit member: where in the union (machine/aliasing.py)
    # A RefUnion's members' (tiling, swizzle), by their ExtractAliasedRef,
    # where the allocation gives them (from jax 0.12.1: run_scoped's
    # ref_transforms, one tuple a member; before, each member's own chain)
    self.members = None
    # An input lent read-only (execute/buffers.py): nothing writes it in a
    # launch that completes, so its reads race with nothing and are not
    # tracked (a write fails, and the launch runs again with a copy).
    self.lent = False
    self.nbytes = data.nbytes if data.dtype != object else 8 * data.size

  @property
  def origin(self):
    # (Not stored as self-reference: a cycle per buffer would keep every
    # block's SMEM alive until a cyclic collection.)
    return self._origin or self

  def address(self):
    """The address of data's first byte (cached: views are located by it)."""
    if self._addr is None:
      self._addr = self.data.__array_interface__["data"][0]
    return self._addr

  def __repr__(self):
    return f"<{self.space} {self.name} {self.data.dtype}{list(self.data.shape)}>"


class BarrierSlot:
  """One mbarrier of a block. A phase completes when `num_arrivals` arrivals
  are in and no transaction bytes are pending; `completions` counts
  completed phases."""
  __slots__ = ("name", "num_arrivals", "arrivals", "tx", "completions",
               "waiters", "orders_tensor_core", "waits", "block", "key", "hb",
               "completed_at", "by_copy", "owner", "collective", "leader_tracked", "latest")

  def __init__(self, name, num_arrivals, orders_tensor_core=False, block=None, key=None):
    self.name = name
    self.num_arrivals = num_arrivals
    self.orders_tensor_core = orders_tensor_core
    self.arrivals = 0
    self.tx = 0
    self.completions = 0
    self.completed_at = []  # when each phase completed (cycles)
    self.latest = 0.0       # the latest clock of an arrival in the phase under way
    self.by_copy = []       # per phase: whether an async copy's bytes completed it
    self.waiters = []    # tasks blocked on it (scheduler.Resource protocol)
    self.waits = {}      # warpgroup -> [completions it observed, where it last waited]
    self.block = block   # the block whose SMEM holds it
    self.key = key       # (allocation, flat index): the same in every block
    self.hb = None       # the happens-before observer's state for it
    self.owner = None    # the Buffer of its allocation
    self.collective = ()  # a cluster barrier's cluster axes
    self.leader_tracked = False  # arrivals go to the leader block's copy only

  def __repr__(self):
    return (f"<barrier {self.name}: {self.arrivals}/{self.num_arrivals} arrivals, "
            f"{self.tx} tx bytes pending, {self.completions} completions>")


def barrier_array(name, shape, num_arrivals, orders_tensor_core=False, block=None,
                  alloc=None):
  arr = np.empty(shape, dtype=object)
  flat = arr.reshape(-1)
  for i in range(flat.size):
    label = name if flat.size == 1 else f"{name}[{i}]"
    flat[i] = BarrierSlot(label, num_arrivals, orders_tensor_core, block, (alloc, i))
  return arr
