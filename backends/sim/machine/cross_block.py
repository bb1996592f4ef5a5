"""Races between blocks, found when group results merge (in block order).

Blocks of a launch are unordered on hardware: two accesses of different
blocks to the same GMEM element, one of them a write, race (unless both are
TMA reductions: atomics), in whatever order they ran here. Per GMEM buffer
and element this keeps which block wrote it (plainly or atomically) and up to
two blocks that read it, each with the site; a GMEM buffer only ever read
(inputs, usually) keeps nothing: its reads are logged until its first write
(per region read, its first two blocks), then replayed.
"""
import numpy as np

from pallas_sim.backends.sim.machine.races import _view, advice, element_range


def _others(b, me):
  """Mask of elements last touched by a block other than `me`, or None."""
  lo, hi = b.min(), b.max()
  if hi == 0 or (lo == hi == me):
    return None
  m = (b != 0) & (b != me)
  return m if m.any() else None


class _Summary:
  """Per-element blocks and sites of one GMEM buffer (arrays on first use;
  block numbers are 1-based, 0 is none; 16-bit while they fit)."""

  def __init__(self, shape, cross):
    self.shape = shape
    self.cross = cross
    self.written = False
    self.read_log = {}  # (offset, element strides, shape) -> [(block, site)]
    self.any_xread = self.any_atomic = False

  def __getattr__(self, name):
    if name.startswith("_") or name in ("shape", "cross"):
      raise AttributeError(name)
    dt = self.cross.site_dtype if name.endswith("s") else self.cross.block_dtype
    arr = np.zeros(self.shape, dt)
    setattr(self, name, arr)
    return arr

  def widen_sites(self):
    for name in ("xws", "xas", "xr1s", "xr2s"):
      if name in self.__dict__:
        setattr(self, name, self.__dict__[name].astype(np.int32))


class CrossBlock:
  """Cross-block race detection for one launch; `add` receives a group's
  GMEM access events in order and reports to `log` (races.RaceLog)."""

  def __init__(self, log, num_blocks=1 << 31):
    self.log = log
    self.summaries = {}
    self.block_dtype = np.uint16 if num_blocks < (1 << 16) - 1 else np.int32
    self.site_dtype = np.uint16  # (int32 once a site's number does not fit)

  def _site(self, site):
    if site.id >= (1 << 16) - 1 and self.site_dtype == np.uint16:
      self.site_dtype = np.int32
      for sh in self.summaries.values():
        sh.widen_sites()
    return site.id

  def _summary(self, buf):
    buf = buf.origin  # (a detached group's copy: the launch's buffer)
    s = self.summaries.get(id(buf))
    if s is None:
      s = self.summaries[id(buf)] = _Summary(buf.data.shape, self)
    return s

  def access(self, number, block, buf, off, estrides, shape, site, write, atomic):
    """One GMEM access of block `block`, of the number-th group of the launch
    (the blocks of one group, a cluster, are ordered by happens-before:
    checked inside the group)."""
    me = number + 1
    sh = self._summary(buf)
    V = lambda arr: _view(arr, off, shape, estrides)
    if not sh.written:
      if not write:
        # Per region read, its first two reading blocks: what _add_reader
        # keeps of them at the replay (exactly so where regions do not
        # partly overlap, as tiles do not); a matmul's inputs are read tile
        # by tile by many blocks, and an input is usually never written.
        readers = sh.read_log.setdefault((off, tuple(estrides), tuple(shape)), [])
        if len(readers) < 2 and all(r != me for r, _ in readers):
          readers.append((me, site))
        return
      sh.written = True
      sh.any_xread = bool(sh.read_log)
      for (roff, rest, rshape), readers in sh.read_log.items():
        for rme, rsite in readers:
          self._add_reader(sh, lambda arr: _view(arr, roff, rshape, rest), rme,
                           self._site(rsite))
      sh.read_log = None
    checks = [(V(sh.xwb), sh.xws, "write")]
    if sh.any_atomic and (not atomic or not write):
      checks.append((V(sh.xab), sh.xas, "write"))
    if write and sh.any_xread:
      checks += [(V(sh.xr1b), sh.xr1s, "read"), (V(sh.xr2b), sh.xr2s, "read")]
    for arr, sarr, prior in checks:
      m = _others(arr, me)
      if m is not None:
        rng = element_range(buf, off, estrides, m)
        for sid in np.unique(V(sarr)[m]):
          first = self.log.site_list[int(sid)]
          kind = ("write-write" if prior == "write" and write else
                  "read-write" if prior == "read" else "write-read")
          self.log.add(f"{kind} race between blocks", first, site, block, rng,
                       advice(first, site, same_block=False))
    if write:
      if atomic:
        sh.any_atomic = True
      sid = self._site(site)  # (before the arrays: it may widen them)
      tb, ts = (sh.xab, sh.xas) if atomic else (sh.xwb, sh.xws)
      V(tb)[...] = me
      V(ts)[...] = sid
      return
    sh.any_xread = True
    self._add_reader(sh, V, me, self._site(site))

  @staticmethod
  def _add_reader(sh, V, me, sid):
    """Records block `me` among the (at most two distinct) blocks that read
    the elements of view V, for the cross-block check of later writes."""
    xr1b = V(sh.xr1b)
    lo, hi = xr1b.min(), xr1b.max()
    if lo == hi == me:
      return
    if hi == 0:
      xr1b[...] = me
      V(sh.xr1s)[...] = sid
      return
    new1 = xr1b == 0
    xr1b[new1] = me
    V(sh.xr1s)[new1] = sid
    add2 = (xr1b != me) & (V(sh.xr2b) == 0)
    V(sh.xr2b)[add2] = me
    V(sh.xr2s)[add2] = sid
