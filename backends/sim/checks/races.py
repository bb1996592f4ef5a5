"""Race detection's element shadows and reports (the vector clocks that
stamp accesses are checks/observer.py's).

Each buffer has a shadow per element: the last write and up to two mutually
unordered reads since, each as (component, clock). An access checks and
updates only the elements it touches, so checking is linear in the elements
accessed, whatever the simulated timing. Shadows are reused by the groups of
a launch without resets: each group's clocks start above every clock of the
groups before it, so their entries read as ordered before it.

Blocks of a launch are unordered with each other; conflicting GMEM accesses
of two groups are found when their results merge (checks/cross_block.py):
here, each GMEM access is also emitted as an event, in order, with the
group's intra-group race reports.
"""
import ctypes
import math
import mmap
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numba
import numpy as np

from pallas_sim.backends.sim.base.events import GmemAccess, RaceFound
from pallas_sim.backends.sim.machine import memory
from pallas_sim.backends.sim.machine.aliasing import element_map

NONE = 0                        # "no access": its clock is +inf in every vector
# Zero means "none" in every shadow array (components start at 1, group
# numbers at 1), so shadows are allocated zeroed, which costs nothing until
# touched.


class Site:
  """A static access site: which agent, what primitive, where, which buffer,
  which thread, and `block`: where its group holds several blocks, which
  one (observer.block_of: its coordinates in its cluster when `in_cluster`,
  else its grid index), so that a report names both blocks; else None.
  `library`: its line is inside the installed jax package."""
  __slots__ = ("id", "agent", "prim", "where", "buffer", "access", "thread", "block",
               "in_cluster", "library")

  def __init__(self, sid, agent, prim, where, buffer, access, thread, block=None,
               in_cluster=False):
    self.id, self.agent, self.prim, self.where = sid, agent, prim, where
    self.buffer, self.access, self.thread, self.block = buffer, access, thread, block
    self.in_cluster = in_cluster
    self.library = in_jax(where)

  @property
  def key(self):
    """What the site is (RaceLog.site's arguments): the same in every process."""
    return (self.agent, self.prim, self.where, self.buffer, self.access, self.thread,
            self.block, self.in_cluster)

  @property
  def block_name(self):
    """"block (1, 0)", "cluster block (1,)", or None (the group's only block)."""
    if self.block is None:
      return None
    return f"{'cluster ' if self.in_cluster else ''}block {self.block}"

  @property
  def who(self):
    """The thread that made (or issued) it: "thread 1", "thread 0 of block (1, 0)"."""
    return f"thread {self.thread}" + (f" of {self.block_name}" if self.block_name else "")

  def describe(self, block=None):
    """The access in words; `block`: the grid index of the block that made
    it, where the site does not name one (a race between blocks)."""
    me = self.who + (f" of block {block}" if block is not None else "")
    if self.access in ("end", "wait"):
      return f"{me}, {self.prim} ({self.where})"
    who = {"thread": me,
           "tma_load": f"TMA load issued by {me}",
           "tma_store": f"TMA store issued by {me}",
           "wgmma": f"wgmma group issued by {me}"}[self.agent]
    return f"{self.access} of {self.buffer} by {who} ({self.prim} at {self.where})"


def in_block(where, count):
  """" (block (1, 0); 3 occurrences)", as a report's heading names where
  its example was found and how often; a kernel without a grid has one
  block, which goes unnamed. `where`: "block (1, 0)", "blocks (0,) and
  (1,)", or "block ()"."""
  parts = [] if where == "block ()" else [where]
  if count > 1:
    parts.append(f"{count} occurrences")
  return f" ({'; '.join(parts)})" if parts else ""


class Race:
  """One folded race report: both accesses, an example, and how often."""

  def __init__(self, kind, first, second, example, advice, timing=None, call_site="",
               first_block=None):
    self.kind, self.first, self.second = kind, first, second
    # The example's first access's block, where the sites do not name it
    # (races between blocks): reports name both blocks
    self.first_block = first_block
    # The user's call of a kernel defined outside their files (RaceLog)
    self.call_site = call_site
    # Both accesses are made by jax's own code (Options.library_races).
    self.library = bool(first is not None and first.library and second.library)
    self.example = example  # (block, element range text)
    self.advice = advice
    self.count = 1
    # What the simulated timing saw (timing_verdict), over the occurrences:
    # how many overlapped, and the least slack of those that did not.
    self.overlapped = 0
    self.min_slack = None
    self.timed = 0
    self.fold_timing(timing)

  def fold_timing(self, timing):
    if timing is None:
      return
    self.timed += 1
    overlapped, slack = timing
    if overlapped:
      self.overlapped += 1
    elif self.min_slack is None or slack < self.min_slack:
      self.min_slack = slack

  def timing_text(self):
    """Whether the two accesses overlapped in the simulated timing (the
    values as simulated may be wrong) or were only unordered, with slack."""
    if not self.timed:
      return None
    if self.overlapped == self.timed:
      return ("overlapped in the simulated timing: the second access began before "
              "the first had finished, so with this timing the values can be wrong "
              "on the GPU now")
    slack = f"{self.min_slack:.0f} cycles of slack"
    if self.overlapped:
      return (f"overlapped in {self.overlapped} of {self.timed} occurrences in the "
              f"simulated timing (there the values can be wrong on the GPU now); the "
              f"others had {slack} at least")
    return (f"only unordered: in the simulated timing the first finished before the "
            f"second began, with {slack} at least; a faster GPU, other tiles or "
            f"other timing can close that gap")

  def __str__(self):
    block, rng = self.example
    if self.first is None:  # misuse: one site
      return (f"{self.kind}{in_block(f'block {block}', self.count)}: "
              f"{self.second.describe()}\n    {self.advice}")
    timing = self.timing_text()
    two = self.first_block is not None and self.first.block is None
    where = f"blocks {self.first_block} and {block}" if two else f"block {block}"
    return (f"{self.kind} on {self.second.buffer}{' ' + rng if rng else ''}"
            f"{in_block(where, self.count)}:\n"
            f"    first:  {self.first.describe(self.first_block if two else None)}\n"
            f"    second: {self.second.describe(block if two else None)}\n"
            + (f"    timing: {timing}\n" if timing else "")
            + (f"    in jax's own code, not yours: reported, not raised (pass "
               f"library_races='raise' to fail on it)\n" if self.library else "")
            + (f"    the kernel was called from {self.call_site}\n" if self.call_site
               else "")
            + f"    {self.advice}")


class RaceLog:
  """Sites and folded reports for one launch."""

  def __init__(self, kernel, call_site=""):
    self.kernel = kernel
    self.call_site = call_site  # (a kernel defined outside the user's files)
    self.sites = {}
    self.site_list = []
    self.reports = {}

  def site(self, agent, prim, where, buffer, access, thread, block=None,
           in_cluster=False):
    key = (agent, prim, where, buffer, access, thread, block, in_cluster)
    s = self.sites.get(key)
    if s is None:
      s = self.sites[key] = Site(len(self.site_list), *key)
      self.site_list.append(s)
    return s

  def add(self, kind, first, second, block, rng, advice, timing=None, first_block=None):
    """A race (folded with the others of its kind and sites). `block`: the
    block it was found in; `first_block`: the first access's, where that is
    another block whose sites do not name it (a race between blocks)."""
    key = (kind, first.id if first else -1, second.id)
    r = self.reports.get(key)
    if r is None:
      self.reports[key] = Race(kind, first, second, (block, rng), advice, timing,
                               self.call_site, first_block)
    else:
      r.count += 1
      r.fold_timing(timing)

  def races(self):
    return list(self.reports.values())


_JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__)) + os.sep


def in_jax(where):
  """Whether a user-visible location ("file:line") lies inside the installed
  jax package (its kernels in jax.experimental.pallas.ops, for instance)."""
  path = (where or "").rsplit(":", 1)[0]
  return bool(path) and os.path.abspath(path).startswith(_JAX_DIR)


def timing_verdict(first, second):
  """(overlapped, slack in cycles) of two accesses reported as a race, first
  and second in issue order, each as (start, end): the cycles in which it
  may touch the memory (an async copy or wgmma from its issue to its
  completion; a plain access at one cycle). They overlapped when the second
  began before the first had finished; else the slack is the gap."""
  (_, end1), (start2, _) = first, second
  return (start2 < end1, max(0.0, start2 - end1))


def agent_words(agent):
  """An async agent as reports name it: "TMA store", "TMA load", "wgmma"."""
  return agent.replace("_", " ").replace("tma", "TMA")


def advice(first, second, same_block=True):
  """What synchronization would have ordered the two accesses, where the
  kernel has none that could (observer.HappensBefore.explain names what is
  wrong with the synchronization it does have)."""
  a, b = first, second
  if not same_block:
    atomic = [x for x in (a, b) if x.prim.startswith("atomic_")]
    if atomic:  # (an atomic and a plain access: "use atomics" is half there)
      plain = b if atomic[0] is a else a
      return (f"blocks of one launch are unordered, and atomic updates "
              f"({atomic[0].prim} at {atomic[0].where}) are ordered only with other "
              f"atomic updates of the same elements: the plain {plain.access} "
              f"({plain.where}) may come before, between or after them; make it "
              "atomic too, or do it in a later kernel")
    return ("blocks of one launch are unordered: give each block its own "
            "bytes, or use atomics / separate kernels")
  other = a.block != b.block  # (two blocks of one cluster, or of a semaphore group)
  if other and a.block is not None and b.block is not None:
    kind = "plain" if a.agent == "thread" else agent_words(a.agent)
    return (f"nothing orders {a.who}'s {kind} {a.access} "
            f"({a.where}) before {b.who}'s {b.access} ({b.where}): a block's own "
            "barrier waits and fences order its own threads only; it takes a "
            f"ClusterBarrier (or a semaphore) that {a.block_name} arrives "
            f"on (signals) after it and {b.block_name} waits on before "
            "its access"
            + (" (wait_smem_to_gmem with wait_read_only=False first: copies can only "
               "be awaited by the thread that issued them)"
               if a.agent == "tma_store" else ""))
  if a.agent == "tma_load" and b.agent in ("thread", "wgmma"):
    return (f"no barrier_wait between this TMA load ({a.where}) and this "
            f"{'read' if b.access == 'read' else 'write'} ({b.where})")
  if a.agent == "tma_load" and b.agent == "tma_load":
    return ("two TMA loads into the same SMEM in flight together: barrier_wait "
            f"for the first ({a.where}) before issuing the second ({b.where})")
  if a.agent == "wgmma" and b.agent == "tma_load":
    return (f"the TMA load ({b.where}) overwrites SMEM the wgmma ({a.where}) may "
            "still be reading: wgmma_wait for it first (in emit_pipeline: "
            "delay_release=1 with wgmma_wait(1))")
  if a.agent == "wgmma" and b.prim == "wgmma_accumulator_load(wait_n=None)":
    return (f"wgmma_accumulator_load(..., wait_n=None) ({b.where}) waits for no wgmma "
            f"group, and the wgmma ({a.where}) may still be accumulating: wait_n=0")
  if a.agent == "wgmma":
    return (f"the wgmma ({a.where}) may still be reading or accumulating: "
            f"wgmma_wait before this access ({b.where})")
  if a.agent == "tma_store" and a.access == "read":
    return (f"the TMA store ({a.where}) may still be reading this SMEM: "
            f"wait_smem_to_gmem(..., wait_read_only=True) in {a.who} "
            f"before this access ({b.where})"
            + ("" if a.who == b.who else
               f"; copies can only be awaited by the thread that issued them, "
               f"so {a.who} must wait before it signals {b.who}"))
  if a.agent == "tma_store":
    return (f"the TMA store ({a.where}) may still be writing: "
            f"wait_smem_to_gmem in {a.who} before this access "
            f"({b.where}); copies can only be awaited by the thread that "
            "issued them")
  if a.agent == "thread" and b.agent in ("tma_store", "wgmma", "tma_load"):
    if a.who == b.who:
      return (f"no commit_smem between the plain {a.access} ({a.where}) and the "
              f"{agent_words(b.agent)} ({b.where}) that "
              f"{'overwrites' if b.access == 'write' else 'reads'} it")
    return (f"{a.who}'s plain {a.access} ({a.where}) is not ordered "
            f"before the {agent_words(b.agent)} ({b.where}): commit_smem "
            f"in {a.who}, then a barrier arrival or a semaphore signal that "
            f"{b.who} waits for before it issues the {agent_words(b.agent)}")
  if (a.agent == b.agent == "thread" and a.where == b.where
      and " warp " in str(a.thread) and " warp " in str(b.thread)):
    return (f"every warp runs this {a.access} ({a.where}) on the same elements: in "
            "warp_map, give each warp its own (index them by the warp's "
            "lax.axis_index), or make one warp do it")
  if a.agent == "thread" and b.agent == "thread":
    return (f"no barrier between {a.who}'s {a.access} ({a.where}) and "
            f"{b.who}'s {b.access} ({b.where})")
  return f"nothing orders {a.where} before {b.where}"


class Shadow:
  """Per-element access history of one buffer: the last write and up to two
  mutually unordered reads since, each as (component, clock). Entries left
  by earlier groups need no reset: every group starts its clocks above all
  earlier ones and its vectors at that base, so it sees them as ordered
  before it."""
  _uid = 0
  # Arrays are allocated zeroed on first use (a GMEM input that is only
  # read never needs any; r2* only once two unordered reads happen).

  def __init__(self, shape, comp_dtype, gmem=False):
    Shadow._uid += 1
    self.uid = Shadow._uid
    self.shape = shape
    self.comp_dtype = comp_dtype
    self.read_slots = 0  # read slots that may hold this group's reads
    self.any_read = False  # whether a read was recorded in the current group
    self.group = 0         # the group the two flags above speak for
    # GMEM reads before the buffer's first write in the launch are only
    # logged (inputs are usually never written): replayed at that write.
    self.written = not gmem
    self.read_log = []
    self.any_atomic = False  # whether an atomic write was recorded (`wa`)
    # whether an atomic write was kept in `a2c`/`a2k`: the last write before
    # an unordered atomic one replaced it, itself atomic
    self.any_atomic2 = False
    # What the last whole-view stamps left, by the view's rows (offset, d0,
    # d1, s0, s1) -> (component, clock, and the flat elements [lo, hi) the
    # rows span): every entry under them has that component and a clock no
    # later (the last write; read slot 1). A view stamped again (a
    # pipeline's slot, an accumulator) is then checked in one comparison
    # instead of a scan of its elements. Not for GMEM, whose views seldom
    # come again (an output tile is written once per block).
    self.known_w, self.known_r = {}, {}
    self.summarized = not gmem

  def know(self, known, key, comp, clock):
    """The rows `key` were stamped (comp, clock): what was known of rows
    that overlap them no longer holds. A few views are kept (a pipeline's
    slots), not one per block."""
    if not self.summarized:
      return
    if len(known) >= KNOWN_MAX and key not in known:
      known.clear()
    off, d0, d1, s0, s1 = key
    lo, hi = off, off + (d0 - 1) * s0 + (d1 - 1) * s1 + 1
    for other in [k for k, v in known.items() if v[2] < hi and lo < v[3] and k != key]:
      del known[other]
    known[key] = (comp, clock, lo, hi)

  def forget(self):
    self.known_w.clear()
    self.known_r.clear()

  def reset(self):
    """As new (its arrays zeroed by the caller): a GMEM shadow at the end of
    a group."""
    self.forget()
    self.read_slots = 0
    self.any_read = False
    self.group = 0
    self.written = False
    self.read_log = []
    self.any_atomic = self.any_atomic2 = False

  def slot(self, i):
    """Read slot i's (components, clocks) arrays (allocated on first use)."""
    return getattr(self, f"r{i + 1}c"), getattr(self, f"r{i + 1}k")

  def __getattr__(self, name):  # only called for arrays not yet allocated
    if name.startswith("_"):
      raise AttributeError(name)
    # (flat: every view of it is built from element offsets and strides)
    arr = memory.base_pages(math.prod(self.shape),
                            self.comp_dtype if name.endswith("c") else np.int32)
    setattr(self, name, arr)
    return arr


_PAGE = mmap.PAGESIZE
_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)
_madvise = None
if sys.platform == "linux" and _MADV_DONTNEED is not None:
  _libc = ctypes.CDLL(None, use_errno=True)
  _madvise = _libc.madvise
  _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def release(arr, lo, hi):
  """Zeroes the flat elements [lo, hi) of a C-contiguous array; on Linux the
  whole pages among them go back to the OS (private anonymous memory reads
  as zeros after MADV_DONTNEED), so they cost nothing until touched again."""
  flat = arr.reshape(-1)
  lo, hi = max(lo, 0), min(hi, flat.size)
  if hi <= lo:
    return
  isz = arr.itemsize
  base = arr.__array_interface__["data"][0]
  first = -(-(base + lo * isz) // _PAGE) * _PAGE   # whole pages in [lo, hi)
  last = (base + hi * isz) // _PAGE * _PAGE
  if _madvise is None or last - first < 4 * _PAGE or (first - base) % isz:
    flat[lo:hi] = 0
    return
  flat[lo:(first - base) // isz] = 0
  flat[(last - base) // isz:hi] = 0
  if _madvise(first, last - first, _MADV_DONTNEED) != 0:
    flat[(first - base) // isz:(last - base) // isz] = 0


def element_view(arr, off, shape, estrides):
  """The shadow elements under a data view (same offset and strides)."""
  isz = arr.itemsize
  return np.ndarray(shape, arr.dtype, arr, off * isz, [e * isz for e in estrides])


def _unordered(c, k, vec):
  """Mask of elements whose recorded access (c, k) is not ordered before an
  access whose vector is `vec`, or None. Fast when one component covers the
  whole view, as it does for whole-tile accesses."""
  c0 = c.min()
  if c0 == c.max():
    if k.max() <= vec[c0]:
      return None
    return k > vec[c0]
  m = k > vec[c]
  return m if m.any() else None


def rows_of(shape: Sequence[int], estrides: Sequence[int]
            ) -> tuple[int, int, int, int] | None:
  """A view's elements as d0 rows of d1 (element strides s0 between rows, s1
  within one; contiguous dims merged, so a whole tile is one row): (d0, d1,
  s0, s1), or None where that takes more than two loops or a stride is not
  positive (a broadcast or reversed view)."""
  dims: list[tuple[int, int]] = []
  for n, st in zip(shape, estrides):
    if n == 1:
      continue
    if st <= 0:
      return None
    if dims and dims[-1][1] == n * st:
      dims[-1] = (dims[-1][0] * n, st)
    else:
      dims.append((n, st))
  if len(dims) > 2:
    return None
  dims = [(1, 0)] * (2 - len(dims)) + dims if dims else [(1, 0), (1, 1)]
  return dims[0][0], dims[1][0], dims[0][1], dims[1][1]


KNOWN_MAX = 8  # views a shadow keeps a summary of


@numba.njit(cache=True)
def _ordered(c, k, off, d0, d1, s0, s1, vec):
  """Whether every entry (c, k) of flat shadows under the rows is ordered
  before vec (k <= vec[c]). One component under them all (a tile written by
  one agent) is one comparison, after a min/max pass that vectorizes along
  contiguous rows (8x faster than the row slices' reductions it replaces:
  1.5 against 13 us a 128x64 tile); else one element at a time."""
  if s1 != 1 and s0 == 1:  # (a transposed view: its columns are contiguous)
    d0, d1, s0, s1 = d1, d0, s1, s0
  c0 = c[off]
  cmin, cmax, kmax = c0, c0, k[off]
  for r in range(d0):
    e = off + r * s0
    if s1 == 1:
      cr, kr = c[e:e + d1], k[e:e + d1]
      for i in range(d1):
        v = cr[i]
        cmin, cmax = min(cmin, v), max(cmax, v)
      for i in range(d1):
        kmax = max(kmax, kr[i])
    else:
      for i in range(d1):
        x = e + i * s1
        v = c[x]
        cmin, cmax = min(cmin, v), max(cmax, v)
        kmax = max(kmax, k[x])
  if cmin == cmax:
    return kmax <= vec[c0]
  for r in range(d0):
    e = off + r * s0
    for i in range(d1):
      x = e + i * s1
      if k[x] > vec[c[x]]:
        return False
  return True


def all_ordered(c, k, vec):
  """Whether every entry (c, k) of a whole flat shadow is ordered before vec."""
  return c.size == 0 or _ordered(c, k, 0, 1, c.size, 0, 1, vec)


@numba.njit(cache=True)
def _stamp(c, k, off, d0, d1, s0, s1, comp, clock, clock_too):
  """The entries under the rows become (comp, clock) (`clock_too`), or get
  the component comp alone."""
  for r in range(d0):
    e = off + r * s0
    if s1 == 1:
      c[e:e + d1] = comp
      if clock_too:
        k[e:e + d1] = clock
    else:
      c[e:e + (d1 - 1) * s1 + 1:s1] = comp
      if clock_too:
        k[e:e + (d1 - 1) * s1 + 1:s1] = clock


@numba.njit(cache=True)
def plain_access(wc, wk, rc, rk, slot, off, d0, d1, s0, s1, vec, rvec, comp, clock,
                 write, check_w, check_r):
  """access()'s common case in one call: nothing unordered under the view.
  A write: the last write and (`slot`) the one read slot ordered before
  it; it becomes the last write, the slot cleared. A read: the last write
  and the one slot ordered before it; it takes the slot. False (nothing
  changed) where something is unordered: access() then reports it.
  `check_w`, `check_r`: whether the last write, the slot, need looking at
  (not where the shadow's summary of these rows says they are ordered);
  `rvec`: the vector the slot is checked with (Tracker.access's
  against_reads).
  Tracker.access calls it before its numpy path; tests/test_shadow_fast_path.py
  replaces it with one that always returns False, to hold the numpy path
  alone against it."""
  if check_w and not _ordered(wc, wk, off, d0, d1, s0, s1, vec):
    return False
  if slot and check_r and not _ordered(rc, rk, off, d0, d1, s0, s1, rvec):
    return False
  if write:
    _stamp(wc, wk, off, d0, d1, s0, s1, comp, clock, True)
    if slot:
      _stamp(rc, rk, off, d0, d1, s0, s1, NONE, 0, False)
  else:
    _stamp(rc, rk, off, d0, d1, s0, s1, comp, clock, True)
  return True


def element_range(buf, off, estrides, mask):
  """Text naming the elements (and bytes) of buf under `mask`."""
  idx = np.argwhere(mask)
  flat = off + (idx @ np.asarray(estrides, np.int64) if idx.shape[1] else
                np.zeros(len(idx), np.int64))
  lo, hi = int(flat.min()), int(flat.max())
  coords = lambda i: tuple(int(x) for x in np.unravel_index(i, buf.data.shape))
  if buf.packed is not None:  # (a RefUnion's 4-bit member: bytes of its union)
    o = buf.packed.offset
    return (f"elements {coords(lo)}..{coords(hi)} "
            f"(bytes {o + lo // 2}..{o + hi // 2 + 1} of {buf.packed.union.name})")
  isz = buf.data.itemsize
  return (f"elements {coords(lo)}..{coords(hi)} "
          f"(bytes {lo * isz}..{(hi + 1) * isz})")


class Tracker:
  """Element shadows of one launch's buffers, checked against the vector
  clocks of the group of blocks running now. Race reports and GMEM accesses
  go, in order, to the group's event list (`events`) as
  base/events.py's RaceFound and GmemAccess."""

  def __init__(self, log, comp_dtype=np.uint8, release_bytes=16 << 20):
    self.log = log               # the launch's sites (reports fold at merge)
    self.comp_dtype = comp_dtype
    # GMEM shadow bytes touched and not yet given back, per shadow, above
    # which they are (execute/tuning.py's Tuning.release_bytes)
    self.release_bytes = release_bytes
    self.base = 0       # the current group's clocks start above this
    self.group = 0      # 1-based number of the group running now
    # the running group's events (start_group gives each group its list)
    self.events: list[Any] = []
    self.thread_comps = None
    self.pool = {}
    # (shadow uid, component, clock) -> (site, the issuing warpgroup's clock
    # at issue, what that agent knew of each warpgroup's clock): a
    # warpgroup's clock ticks at each of its accesses, so this is exact for
    # them (for async work, the last site of that stamp on that buffer).
    self.sites = {}
    self.logged = set()  # shadows whose read_log has entries
    self.gmem_spans = {}  # GMEM shadow -> the flat elements [lo, hi) touched
    self.dirty = {}  # GMEM shadow -> [lo, hi) touched since its last release
    # (shape, element strides) -> rows_of() or () (access's common case)
    self.rows: dict[tuple[Any, Any], tuple[int, int, int, int] | tuple[()]] = {}
    # (recorded, current, agent, vc, avc, swapped, buffer) -> text or None:
    # what is wrong with the synchronization the kernel has
    # (observer.HappensBefore.explain)
    self.explain: Callable[..., str | None] | None = None

  def start_group(self, events):
    self.group += 1
    self.events = events
    self.thread_comps = None  # the group's warpgroups' components (observer.ready)

  def end_group(self, next_base):
    self.base = next_base
    # What only this group's accesses needed: the sites of its clocks (a
    # later group's accesses are ordered after all of them, so never report
    # them) and GMEM reads logged before a first write (replayed for the
    # current group only). A launch of thousands of blocks kept them all.
    self.sites.clear()
    for sh in self.logged:
      if sh.read_log:
        sh.read_log.clear()
    self.logged.clear()
    # GMEM shadows likewise hold nothing a later group needs: stale entries
    # are ordered before every later access, as a scratch shadow's are. Yet
    # a launch of thousands of blocks would touch every page of an
    # output's shadows, in every worker process (a tile's rows touch a page
    # each: some 30 times the tile's own bytes): so the span touched since
    # the last release (consecutive blocks share their rows) is zeroed and
    # its whole pages given back once it passes release_bytes.
    for sh, (lo, hi) in self.gmem_spans.items():
      was = self.dirty.get(sh)
      if was is not None:
        lo, hi = min(lo, was[0]), max(hi, was[1])
      arrays = [a for a in vars(sh).values() if isinstance(a, np.ndarray)]
      if (hi - lo) * sum(a.itemsize for a in arrays) < self.release_bytes:
        self.dirty[sh] = (lo, hi)
        continue
      for arr in arrays:
        release(arr, lo, hi)
      sh.reset()
      self.dirty.pop(sh, None)
    self.gmem_spans.clear()

  def shadow(self, buf):
    sh = buf.shadow
    if sh is None:
      # A block's scratch buffers reuse earlier blocks' shadows (see
      # Shadow): keyed by the allocation that made them.
      key = (buf.alloc_key, buf.data.shape) if buf.alloc_key else None
      sh = self.pool.get(key) if key else None
      if sh is None:
        sh = Shadow(buf.data.shape, self.comp_dtype, gmem=buf.space == "gmem")
        if key:
          self.pool[key] = sh
      buf.shadow = sh
    return sh

  def access(self, buf, view, vec, comp, clock, site, write, agent, block,
             atomic=False, issued=None, span=(0.0, 0.0), against_writes=None,
             against_reads=None):
    """Checks one access against the shadow, reports races, records it.
    `agent`: the clock state of the warpgroup that made (or issued) it;
    `issued`: its vector at issue, for async work (default `vec`), to
    report pairs in happens-before order; `span`: (when it may start to
    touch the memory, when it took effect) in simulated cycles: the issue
    and the completion of async work, the thread's clock twice for a plain
    access. `against_writes`, `against_reads` (default `vec`): the vectors
    it is checked with against the last write and against the reads since,
    where those differ (a thread whose lanes are unordered,
    observer.HappensBefore.plain); a read's `against_reads` also says which
    reads it subsumes."""
    wv = vec if against_writes is None else against_writes
    rv = vec if against_reads is None else against_reads
    if view.size == 0 or (buf.lent and not write):
      return
    sh = self.shadow(buf)
    off, estrides, shape = element_map(buf, view)
    if buf.space == "gmem":  # (checked against other groups when they merge)
      self.events.append(GmemAccess(block.group.number, block.index, buf, off, estrides,
                                    shape, site, write, atomic))
      lo = off + sum((n - 1) * e for n, e in zip(shape, estrides) if e < 0)
      hi = off + sum((n - 1) * e for n, e in zip(shape, estrides) if e > 0) + 1
      was = self.gmem_spans.get(sh)
      self.gmem_spans[sh] = (lo, hi) if was is None else (min(lo, was[0]),
                                                          max(hi, was[1]))
    if issued is None:
      issued = vec
    issue = int(issued[agent.thread])
    know = issued[self.thread_comps]
    if not sh.written:
      if not write:
        self.sites[(sh.uid, comp, clock)] = (site, issue, know, span)
        sh.read_log.append((self.group, off, estrides, shape, comp, clock, rv.copy()))
        self.logged.add(sh)
        return
      self._replay(sh)
    if sh.group != self.group:
      # Entries of earlier groups are all ordered before this one (see
      # Shadow), so reads recorded then need no checking now.
      sh.group = self.group
      sh.any_read = False
      sh.read_slots = 0
    self.sites[(sh.uid, comp, clock)] = (site, issue, know, span)
    if sh.read_slots <= 1 and not (atomic or sh.any_atomic):
      rows = self.rows.get((shape, estrides))
      if rows is None:
        rows = self.rows[(shape, estrides)] = rows_of(shape, estrides) or ()
      if rows:
        # (a read takes the slot; a write clears it where this group read)
        slot = not write or (sh.read_slots == 1 and sh.any_read)
        rc, rk = (sh.r1c, sh.r1k) if slot else (sh.wc, sh.wk)  # (not read without slot)
        key = (off,) + rows
        kw = sh.known_w.get(key)
        kr = sh.known_r.get(key) if slot else None
        if ((kw is None or kw[1] <= wv[kw[0]]) and (kr is None or kr[1] <= rv[kr[0]])
            and plain_access(sh.wc, sh.wk, rc, rk, slot, off, *rows, wv, rv, comp,
                             clock, write, kw is None, kr is None)):
          if write:
            sh.know(sh.known_w, key, comp, clock)
            if slot:
              sh.know(sh.known_r, key, NONE, 0)
          else:
            sh.know(sh.known_r, key, comp, clock)
            sh.any_read = True
            sh.read_slots = 1
          return
    sh.forget()  # (the arrays change below, element by element)
    V = lambda arr: element_view(arr, off, shape, estrides)
    wc, wk = V(sh.wc), V(sh.wk)
    m = _unordered(wc, wk, wv)
    if m is not None and atomic and sh.any_atomic:
      # Atomic read-modify-writes do not race with each other.
      m &= V(sh.wa) == 0
      m = m if m.any() else None
    if m is not None:
      self.report("write", m, wc, wk, sh, buf, off, estrides, site, issue, agent, block,
                  span, (comp, clock, vec, issued))
    if sh.any_atomic2 and not atomic:
      # The atomic write an unordered atomic one replaced as the last write
      # (below) races with a plain access too.
      ac, ak = V(sh.a2c), V(sh.a2k)
      m = _unordered(ac, ak, wv)
      if m is not None:
        self.report("write", m, ac, ak, sh, buf, off, estrides, site, issue, agent,
                    block, span, (comp, clock, vec, issued))
      if write:
        ac[...] = NONE
    if write:
      if atomic and sh.any_atomic:
        # Atomic writes do not race with each other, but each races with
        # plain accesses: the one this replaces stays checked where the two
        # are unordered, or a plain access by this one's thread would not
        # see it.
        was = (V(sh.wa) != 0) & (wc != NONE)
        was &= wk > wv[wc]
        if was.any():
          V(sh.a2c)[was] = wc[was]
          V(sh.a2k)[was] = wk[was]
          sh.any_atomic2 = True
      wc[...] = comp
      wk[...] = clock
      if atomic or sh.any_atomic:
        V(sh.wa)[...] = atomic  # (whether the last write was atomic)
        sh.any_atomic = True
      if not sh.any_read:  # e.g. an output only ever written
        return
      for i in range(sh.read_slots):
        rc, rk = map(V, sh.slot(i))
        m = _unordered(rc, rk, rv)
        if m is not None:
          self.report("read", m, rc, rk, sh, buf, off, estrides, site, issue, agent,
                      block, span, (comp, clock, vec, issued))
        rc[...] = NONE
      return
    self._read(sh, V, rv, comp, clock)

  def _read(self, sh, V, vec, comp, clock):
    """A read goes into the read slots (V: a shadow array's elements under
    it; vec: its vector)."""
    sh.any_read = True
    # Every read since the last write that is unordered with the others is
    # kept, in as many slots as it takes: a read ordered before this one is
    # subsumed by it (any access after this one is after it too), so this
    # one goes to the first slot whose entry it subsumes (or that is empty).
    pending = None
    for i in range(max(sh.read_slots, 1)):
      rc, rk = map(V, sh.slot(i))
      keep = _unordered(rc, rk, vec)
      if keep is None and pending is None:  # (the common case: one slot)
        rc[...] = comp
        rk[...] = clock
        sh.read_slots = max(sh.read_slots, 1)
        return
      place = ~keep if keep is not None else np.ones(rc.shape, bool)
      if pending is not None:
        place &= pending
      rc[place] = comp
      rk[place] = clock
      pending = ~place if pending is None else pending & ~place
      sh.read_slots = max(sh.read_slots, i + 1)
      if not pending.any():
        return
    i = sh.read_slots  # (a further mutually unordered read: a new slot)
    rc, rk = map(V, sh.slot(i))
    rc[pending] = comp
    rk[pending] = clock
    sh.read_slots = i + 1

  def _replay(self, sh):
    """The first write to a GMEM buffer: the reads logged so far in the
    current group go into its read slots, as if they had been recorded
    when they were made (each with its own vector: reads unordered with
    each other each keep a slot, so the write is checked against all)."""
    sh.written = True
    sh.forget()
    log, sh.read_log = sh.read_log, None
    for group, off, estrides, shape, comp, clock, vec in log:
      if group == self.group:
        if sh.group != group:
          sh.group, sh.any_read, sh.read_slots = group, False, 0
        self._read(sh, lambda arr: element_view(arr, off, shape, estrides), vec, comp, clock)

  def report(self, prior, mask, comps, clocks, sh, buf, off, estrides, site,
             issue, agent, block, span, stamp):
    """Records a race for each earlier access in (comps, clocks) under `mask`
    that the access being checked (`site`, by `agent`, a "read" or "write"
    against a `prior` one) is unordered with: a RaceFound in self.events,
    the pair in happens-before order, with the simulated timing's verdict.
    access() calls it from each of its checks (a plain access against the
    work that landed before it, async work's landing against the accesses
    made before it); tests/test_race_orders.py wraps it to see which check
    found a race."""
    rng = element_range(buf, off, estrides, mask)
    pairs = np.unique(np.stack([comps[mask].astype(np.int64), clocks[mask]]), axis=1)
    for c, k in pairs.T:
      first, _, first_know, first_span = self.sites[(sh.uid, int(c), int(k))]
      a, b = (prior, first), (site.access, site)
      spans = (first_span, span)
      # Report in the order the two were issued where happens-before says
      # (async work counts from its issue), whatever order the simulated
      # timing found them in: e.g. a TMA store issued before a barrier,
      # whose SMEM another warpgroup overwrites after waiting on it.
      swapped = agent.pos < len(first_know) and first_know[agent.pos] >= issue
      if swapped:
        a, b = b, a
        spans = spans[::-1]
      kind = ("write-write" if a[0] == b[0] == "write" else
              "read-write" if a[0] == "read" else "write-read") + " race"
      comp, clock, vec, issued = stamp
      text = self.explain and self.explain((first, int(c), int(k)), (site, comp, clock),
                                           agent, issued, vec, swapped, buf)
      # (one thread's own two accesses, unordered among its lanes: the
      # simulation runs a thread's lanes as one, so it has no timing for them)
      lanes = int(c) == comp and first.agent == site.agent == "thread"
      self.events.append(RaceFound(kind, a[1], b[1], block.index, rng,
                                   text or advice(a[1], b[1]),
                                   None if lanes else timing_verdict(*spans)))
