"""Races between blocks, found when group results merge (in block order).

Blocks of a launch are unordered on hardware: two accesses of different
blocks to the same GMEM element, one of them a write, race (unless both are
TMA reductions: atomics), in whatever order they ran here. Per GMEM buffer
and element this keeps which block wrote it (plainly or atomically) and up to
two blocks that read it, each with the site (one record number for both); a
GMEM buffer only ever read (inputs, usually) keeps nothing: its reads are
logged until its first write (per region read, its first two blocks), then
replayed.
"""
import numpy as np

from pallas_sim.backends.sim.checks.races import element_view, advice, element_range


class _Summary:
  """Per-element records of one GMEM buffer (arrays on first use): the
  record (CrossBlock.record: a block and a site) that last wrote each
  element plainly (xw) or atomically (xa; xa2: the last atomic writer from
  another block than xa's, so that a plain access by xa's block still finds
  the others), and of the first two blocks that read it (xr1, xr2); 0 is
  none. One array where a block's and a site's
  were two: an 8192^2 output's cost 256 MiB, now 128 while records fit in
  16 bits."""

  def __init__(self, shape, cross):
    self.shape = shape
    self.cross = cross
    self.written = False
    self.read_log = {}  # (offset, element strides, shape) -> [(block, site)]
    self.any_xread = self.any_atomic = False

  def __getattr__(self, name):
    if name.startswith("_") or name in ("shape", "cross"):
      raise AttributeError(name)
    arr = np.zeros(self.shape, self.cross.record_dtype)
    setattr(self, name, arr)
    return arr

  def widen(self):
    for name in ("xw", "xa", "xa2", "xr1", "xr2"):
      if name in self.__dict__:
        setattr(self, name, self.__dict__[name].astype(np.int32))


class CrossBlock:
  """Cross-block race detection for one launch; `add` receives a group's
  GMEM access events in order and reports to `log` (races.RaceLog)."""

  def __init__(self, log):
    self.log = log
    self.summaries = {}
    # (int32 once a record does not fit)
    self.record_dtype: type[np.uint16] | type[np.int32] = np.uint16
    self.records = {}  # (block number + 1, site id) -> record
    # a record's block number + 1, and its site's id (0: none)
    self.rec_block = np.zeros(64, np.int64)
    self.rec_site = np.zeros(64, np.int64)
    self.grid_index = {}  # block number + 1 -> its grid index (for reports)

  def record(self, me, site):
    """The record of block number me - 1 at `site` (new records may widen
    the summaries: take views of them after)."""
    key = (me, site.id)
    r = self.records.get(key)
    if r is None:
      r = self.records[key] = len(self.records) + 1
      if r >= (1 << 16) - 1 and self.record_dtype == np.uint16:
        self.record_dtype = np.int32
        for sh in self.summaries.values():
          sh.widen()
      if r >= len(self.rec_block):
        pad = np.zeros(len(self.rec_block), np.int64)
        self.rec_block = np.concatenate([self.rec_block, pad])
        self.rec_site = np.concatenate([self.rec_site, pad])
      self.rec_block[r], self.rec_site[r] = me, site.id
    return r

  def _others(self, rec, me):
    """Mask of the elements of a record view that a block other than `me`
    touched, or None."""
    lo, hi = rec.min(), rec.max()
    if hi == 0 or (lo == hi and self.rec_block[lo] == me):
      return None
    m = (rec != 0) & (self.rec_block[rec] != me)
    return m if m.any() else None

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
    self.grid_index[me] = block
    sh = self._summary(buf)
    V = lambda arr: element_view(arr, off, shape, estrides)
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
          r = self.record(rme, rsite)
          self._add_reader(sh, lambda arr: element_view(arr, roff, rshape, rest), rme, r)
      sh.read_log = None
    checks = [(V(sh.xw), "write")]
    if sh.any_atomic and (not atomic or not write):
      checks += [(V(sh.xa), "write"), (V(sh.xa2), "write")]
    if write and sh.any_xread:
      checks += [(V(sh.xr1), "read"), (V(sh.xr2), "read")]
    for rec, prior in checks:
      m = self._others(rec, me)
      if m is not None:
        rng = element_range(buf, off, estrides, m)
        recs = rec[m]
        for sid in np.unique(self.rec_site[recs]):
          first = self.log.site_list[int(sid)]
          other = self.rec_block[recs[self.rec_site[recs] == sid][0]]
          kind = ("write-write" if prior == "write" and write else
                  "read-write" if prior == "read" else "write-read")
          self.log.add(f"{kind} race between blocks", first, site, block, rng,
                       advice(first, site, same_block=False),
                       first_block=self.grid_index.get(int(other)))
    r = self.record(me, site)  # (before the views: it may widen the arrays)
    if write:
      if atomic:
        sh.any_atomic = True
        xa = V(sh.xa)
        other = (xa != 0) & (self.rec_block[xa] != me)
        if other.any():
          V(sh.xa2)[other] = xa[other]
      V(sh.xa if atomic else sh.xw)[...] = r
      return
    sh.any_xread = True
    self._add_reader(sh, V, me, r)

  def _add_reader(self, sh, V, me, r):
    """Records block `me` (record r) among the (at most two distinct)
    blocks that read the elements of view V, for the cross-block check of
    later writes."""
    xr1 = V(sh.xr1)
    lo, hi = xr1.min(), xr1.max()
    if lo == hi and lo and self.rec_block[lo] == me:
      return
    if hi == 0:
      xr1[...] = r
      return
    xr1[xr1 == 0] = r
    add2 = (self.rec_block[xr1] != me) & (V(sh.xr2) == 0)
    V(sh.xr2)[add2] = r
