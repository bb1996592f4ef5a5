"""Happens-before race detection: vector clocks and element shadows.

Agents and their clock components (per block):
- each Pallas thread t: component t, ticking at every release it makes;
- the async work a thread issues, as channels whose clock is a sequence
  number, because waits observe them in order: wgmma groups (wgmma_wait(n)
  observes all but the newest n), TMA store groups, split into their SMEM
  reads and GMEM writes (wait_smem_to_gmem(n, wait_read_only=...));
- each barrier: component b whose clock is its phase; a TMA load that
  completes phase k is stamped (b, k), and a wait that observed phase k
  learns b >= k and everything that arrived in it.
An access is ordered after an earlier one stamped (c, k) iff the accessing
agent's vector V has V[c] >= k. Async work issued by a thread sees that
thread's plain SMEM accesses only up to its last commit_smem (the async-proxy
fence): its vector takes thread components from the thread's `avc`.

Each block's clocks start above every clock of the blocks before it, so
shadows carry over between blocks without resets. Each buffer has a shadow
per element: the last write and up to two mutually
unordered reads since, each as (component, clock, site). An access checks
and updates only the elements it touches, so checking is linear in the
elements accessed, whatever the simulated timing.
"""
import numpy as np

CAP = 256                       # clock components per block
NONE = 0                        # "no access": its clock is +inf in every vector
INF = np.iinfo(np.int64).max
# Zero means "none" in every shadow array (components start at 1, block ids
# at 1), so shadows are allocated zeroed, which costs nothing until touched.


def new_vector(base=0):
  """A vector that has seen everything stamped below `base`."""
  v = np.full(CAP, base, np.int64)
  v[NONE] = INF
  return v


class Site:
  """A static access site: which agent, what primitive, where, which buffer."""
  __slots__ = ("id", "agent", "prim", "where", "buffer", "access", "thread")

  def __init__(self, sid, agent, prim, where, buffer, access, thread):
    self.id, self.agent, self.prim, self.where = sid, agent, prim, where
    self.buffer, self.access, self.thread = buffer, access, thread

  def describe(self):
    if self.access in ("end", "wait"):
      return f"thread {self.thread}, {self.prim} ({self.where})"
    who = {"thread": f"thread {self.thread}",
           "tma_load": f"TMA load issued by thread {self.thread}",
           "tma_store": f"TMA store issued by thread {self.thread}",
           "wgmma": f"wgmma group issued by thread {self.thread}"}[self.agent]
    return f"{self.access} of {self.buffer} by {who} ({self.prim} at {self.where})"


class Race:
  """One folded race report: both accesses, an example, and how often."""

  def __init__(self, kind, first, second, example, advice):
    self.kind, self.first, self.second = kind, first, second
    self.example = example  # (block, element range text)
    self.advice = advice
    self.count = 1

  def __str__(self):
    block, rng = self.example
    times = f"; {self.count} occurrences" if self.count > 1 else ""
    if self.first is None:  # misuse: one site
      return (f"{self.kind} (block {block}{times}): {self.second.describe()}\n"
              f"    {self.advice}")
    return (f"{self.kind} on {self.second.buffer} {rng} (block {block}{times}):\n"
            f"    first:  {self.first.describe()}\n"
            f"    second: {self.second.describe()}\n"
            f"    {self.advice}")


class RaceLog:
  """Sites and folded reports for one launch."""

  def __init__(self, kernel):
    self.kernel = kernel
    self.sites = {}
    self.site_list = []
    self.reports = {}

  def site(self, agent, prim, where, buffer, access, thread):
    key = (agent, prim, where, buffer, access, thread)
    s = self.sites.get(key)
    if s is None:
      s = self.sites[key] = Site(len(self.site_list), *key)
      self.site_list.append(s)
    return s

  def add(self, kind, first, second, block, rng, advice):
    key = (kind, first.id if first else -1, second.id)
    r = self.reports.get(key)
    if r is None:
      self.reports[key] = Race(kind, first, second, (block, rng), advice)
    else:
      r.count += 1

  def races(self):
    return list(self.reports.values())


def advice(first, second, same_block=True):
  """What synchronization would have ordered the two accesses."""
  a, b = first, second
  if not same_block:
    return ("blocks of one launch are unordered: give each block its own "
            "bytes, or use atomics / separate kernels")
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
  if a.agent == "wgmma":
    return (f"the wgmma ({a.where}) may still be reading or accumulating: "
            f"wgmma_wait before this access ({b.where})")
  if a.agent == "tma_store" and a.access == "read":
    return (f"the TMA store ({a.where}) may still be reading this SMEM: "
            f"wait_smem_to_gmem(..., wait_read_only=True) in thread {a.thread} "
            f"before this access ({b.where})"
            + ("" if a.thread == b.thread else
               "; copies can only be awaited by the thread that issued them, "
               "so thread {} must wait before it signals thread {}".format(
                   a.thread, b.thread)))
  if a.agent == "tma_store":
    return (f"the TMA store ({a.where}) may still be writing: "
            f"wait_smem_to_gmem in thread {a.thread} before this access "
            f"({b.where}); copies can only be awaited by the thread that "
            "issued them")
  if a.agent == "thread" and b.agent in ("tma_store", "wgmma", "tma_load"):
    if a.thread == b.thread:
      return (f"no commit_smem between the plain {a.access} ({a.where}) and the "
              f"{b.agent.replace('_', ' ')} ({b.where}) that "
              f"{'overwrites' if b.access == 'write' else 'reads'} it")
    return (f"thread {a.thread}'s plain {a.access} ({a.where}) is not ordered "
            f"before the {b.agent.replace('_', ' ')} ({b.where}): commit_smem "
            f"in thread {a.thread}, then a barrier to thread {b.thread}")
  if a.agent == "thread" and b.agent == "thread":
    return (f"no barrier between thread {a.thread}'s {a.access} ({a.where}) and "
            f"thread {b.thread}'s {b.access} ({b.where})")
  return f"nothing orders {a.where} before {b.where}"


class Shadow:
  """Per-element access history of one buffer: the last write and up to two
  mutually unordered reads since, each as (component, clock). Entries left
  by earlier blocks need no reset: every block starts its clocks above all
  earlier ones and its vectors at that base, so it sees them as ordered
  before it. For GMEM, `x*b`/`x*s` hold which blocks wrote (plainly or
  atomically) and read each element, and at which site: blocks of a launch
  are unordered with each other."""
  _uid = 0
  # Arrays are allocated zeroed on first use (a GMEM input that is only
  # read never needs any; r2*, xa*, xr* only once such accesses happen).
  _TYPES = {"wc": np.uint8, "r1c": np.uint8, "r2c": np.uint8}

  def __init__(self, shape, gmem=False):
    Shadow._uid += 1
    self.uid = Shadow._uid
    self.shape = shape
    self.any_r2 = False  # whether an element held two unordered reads (block)
    self.any_read = False  # whether a read was recorded in the current block
    self.block = 0         # the block the two flags above speak for
    self.gmem = gmem
    # GMEM reads before the buffer's first write in the launch are only
    # logged (inputs are usually never written): replayed at that write.
    self.written = not gmem
    self.read_log = []
    self.any_xread = self.any_atomic = False

  def __getattr__(self, name):  # only called for arrays not yet allocated
    if name.startswith("_"):
      raise AttributeError(name)
    arr = np.zeros(self.shape, self._TYPES.get(name, np.int32))
    setattr(self, name, arr)
    return arr


def _view(arr, off, shape, estrides):
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


def _others(b, me):
  """Mask of elements last touched by a block other than `me`, or None."""
  lo, hi = b.min(), b.max()
  if hi == 0 or (lo == hi == me):
    return None
  m = (b != 0) & (b != me)
  return m if m.any() else None


def _add_reader(sh, V, block, sid):
  """Records `block` among the (at most two distinct) blocks that read the
  elements of view V, for the cross-block check of later writes."""
  xr1b = V(sh.xr1b)
  lo, hi = xr1b.min(), xr1b.max()
  if lo == hi == block:
    return
  if hi == 0:
    xr1b[...] = block
    V(sh.xr1s)[...] = sid
    return
  new1 = xr1b == 0
  xr1b[new1] = block
  V(sh.xr1s)[new1] = sid
  add2 = (xr1b != block) & (V(sh.xr2b) == 0)
  V(sh.xr2b)[add2] = block
  V(sh.xr2s)[add2] = sid


def element_map(buf, view):
  """(offset, element strides, shape) of `view` in buf.data's elements, or a
  covering 1-D range when the view is a bitcast."""
  base = buf.data
  isz = base.itemsize
  off_b = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
  if view.dtype.itemsize == isz and all(s % isz == 0 for s in view.strides):
    return off_b // isz, [s // isz for s in view.strides], view.shape
  lo = off_b // isz
  span = sum((d - 1) * abs(s) for d, s in zip(view.shape, view.strides)) + view.itemsize
  return lo, [1], (-(-span // isz),)


class Tracker:
  """Race detection state for one launch: shadows, sites, reports."""

  def __init__(self, kernel, nthreads=1):
    self.log = RaceLog(kernel)
    self.block = None
    self.block_id = 0   # 1-based while running; 0 means none
    self.nthreads = nthreads
    self.base = 0       # the current block's clocks start above this
    self.pool = {}
    # (shadow uid, component, clock) -> site of the access so stamped; a
    # thread's clock ticks at each of its accesses, so this is exact for
    # them (for async work, the last site of that stamp on that buffer).
    self.sites = {}

  def shadow(self, buf):
    sh = buf.shadow
    if sh is None:
      # A block's scratch buffers reuse the previous block's shadows (see
      # Shadow): keyed by the allocation that made them.
      key = (buf.alloc_key, buf.data.shape) if buf.alloc_key else None
      sh = self.pool.get(key) if key else None
      if sh is None:
        sh = Shadow(buf.data.shape, gmem=buf.space == "gmem")
        if key:
          self.pool[key] = sh
      buf.shadow = sh
    return sh

  def _range(self, buf, off, estrides, mask):
    idx = np.argwhere(mask)
    flat = off + (idx @ np.asarray(estrides, np.int64) if idx.shape[1] else
                  np.zeros(len(idx), np.int64))
    lo, hi = int(flat.min()), int(flat.max())
    coords = lambda i: tuple(int(x) for x in np.unravel_index(i, buf.data.shape))
    isz = buf.data.itemsize
    return (f"elements {coords(lo)}..{coords(hi)} "
            f"(bytes {lo * isz}..{(hi + 1) * isz})")

  def access(self, buf, view, vec, comp, clock, site, write, atomic=False,
             issued=None):
    """Checks one access against the shadow, reports races, records it.
    `issued` is the vector of the access's agent when it was issued (for
    async work; default `vec`), to report pairs in happens-before order."""
    if view.size == 0:
      return
    sh = self.shadow(buf)
    off, estrides, shape = element_map(buf, view)
    if issued is None:
      issued = vec
    issue = int(issued[site.thread + 1])
    # What this access's agent knew of each thread's clock when issued: to
    # report two accesses in happens-before order of their issue.
    know = tuple(issued[1:1 + self.nthreads])
    if not sh.written:
      if not write:
        self.sites[(sh.uid, comp, clock)] = (site, issue, know)
        sh.read_log.append((self.block_id, off, estrides, shape, comp, clock, site))
        return
      self._replay(sh)
    if sh.block != self.block_id:
      # Entries of earlier blocks are all ordered before this one (see
      # Shadow), so reads recorded then need no checking now.
      sh.block = self.block_id
      sh.any_read = sh.any_r2 = False
    V = lambda arr: _view(arr, off, shape, estrides)
    wc, wk = V(sh.wc), V(sh.wk)
    self.sites[(sh.uid, comp, clock)] = (site, issue, know)
    if sh.gmem:
      self._cross_block(sh, buf, off, estrides, shape, site, write, atomic, V)
    m = _unordered(wc, wk, vec)
    if m is not None:
      self._report("write", m, wc, wk, sh, buf, off, estrides, site, issue)
    if write:
      wc[...] = comp
      wk[...] = clock
      if not sh.any_read:  # e.g. an output only ever written
        return
      r1c = V(sh.r1c)
      reads = [(r1c, V(sh.r1k))]
      if sh.any_r2:
        reads.append((V(sh.r2c), V(sh.r2k)))
      for rc, rk in reads:
        m = _unordered(rc, rk, vec)
        if m is not None:
          self._report("read", m, rc, rk, sh, buf, off, estrides, site, issue)
        rc[...] = NONE
      return
    sh.any_read = True
    r1c, r1k = V(sh.r1c), V(sh.r1k)
    # Keep at most two mutually unordered reads: a read ordered before this
    # one is subsumed by it (any access after this one is after it too).
    keep1 = _unordered(r1c, r1k, vec)
    if keep1 is None:
      r1c[...] = comp
      r1k[...] = clock
      return
    new1 = ~keep1
    r1c[new1] = comp
    r1k[new1] = clock
    V(sh.r2c)[keep1] = comp
    V(sh.r2k)[keep1] = clock
    sh.any_r2 = True

  def _replay(self, sh):
    """The first write to a GMEM buffer: record the reads logged so far, as
    cross-block readers and, for the current block, as its last reads (a
    current-block read concurrent with another is kept only once)."""
    sh.written = True
    sh.any_xread = bool(sh.read_log)
    for bid, off, estrides, shape, comp, clock, site in sh.read_log:
      V = lambda arr: _view(arr, off, shape, estrides)
      _add_reader(sh, V, bid, site.id)
      if bid == self.block_id:
        sh.any_read = True
        sh.block = bid
        V(sh.r1c)[...] = comp
        V(sh.r1k)[...] = clock
    sh.read_log = None

  def _report(self, prior, mask, comps, clocks, sh, buf, off, estrides, site,
              issue):
    rng = self._range(buf, off, estrides, mask)
    pairs = np.unique(np.stack([comps[mask].astype(np.int64), clocks[mask]]), axis=1)
    for c, k in pairs.T:
      first, _, first_know = self.sites[(sh.uid, int(c), int(k))]
      a, b = (prior, first), (site.access, site)
      # Report in the order the two were issued where happens-before says
      # (async work counts from its issue), whatever order the simulated
      # timing found them in: e.g. a TMA store issued before a barrier,
      # whose SMEM another thread overwrites after waiting on it.
      if first_know is not None and first_know[site.thread] >= issue:
        a, b = b, a
      kind = ("write-write" if a[0] == b[0] == "write" else
              "read-write" if a[0] == "read" else "write-read") + " race"
      self.log.add(kind, a[1], b[1], self.block, rng, advice(a[1], b[1]))

  def _cross_block(self, sh, buf, off, estrides, shape, site, write, atomic, V):
    """Blocks of a launch are unordered: any conflicting pair from two blocks
    is a race, in whatever order the simulator ran them."""
    me = self.block_id
    checks = [(V(sh.xwb), sh.xws, "write")]
    if sh.any_atomic and (not atomic or not write):
      checks.append((V(sh.xab), sh.xas, "write"))
    if write and sh.any_xread:
      checks += [(V(sh.xr1b), sh.xr1s, "read"), (V(sh.xr2b), sh.xr2s, "read")]
    for arr, sarr, prior in checks:
      m = _others(arr, me)
      if m is not None:
        rng = self._range(buf, off, estrides, m)
        for sid in np.unique(V(sarr)[m]):
          first = self.log.site_list[int(sid)]
          kind = ("write-write" if prior == "write" and write else
                  "read-write" if prior == "read" else "write-read")
          self.log.add(f"{kind} race between blocks", first, site, self.block,
                       rng, advice(first, site, same_block=False))
    if write:
      if atomic:
        sh.any_atomic = True
      tb, ts = (sh.xab, sh.xas) if atomic else (sh.xwb, sh.xws)
      V(tb)[...] = me
      V(ts)[...] = site.id
      return
    sh.any_xread = True
    _add_reader(sh, V, me, site.id)

  def end_block(self, blk):
    """The next block's clocks start above every clock this one used."""
    top = self.base
    for t in blk.sched.threads:
      top = max(top, int(t.vc[1:].max()), self.base + t.wg_issued,
                self.base + t.store_groups)
    for slot in blk.barriers:
      top = max(top, slot.base + slot.completions)
    self.base = top + 1

  def misuse(self, kind, site, block, text):
    self.log.add(kind, None, site, block, "", text)
