"""Cross-block race detection (checks/cross_block.py) against a model that
keeps, per element, Python tuples of (block, site) where the machine keeps
one 16-bit record number per element and array: the same reports, in the
same order, for random sequences of GMEM accesses."""
import numpy as np
from hypothesis import given, settings, strategies as st

from pallas_sim.backends.sim.machine import memory
from pallas_sim.backends.sim.checks import races
from pallas_sim.backends.sim.checks.cross_block import CrossBlock
from pallas_sim.backends.sim.checks.races import advice, element_range

SHAPE = (4, 8)
# (offset, element strides, shape) of the views accessed: rows, half rows,
# columns, the whole buffer (partly overlapping regions included)
REGIONS = [(8 * r, (8, 1), (1, 8)) for r in range(4)] + [
    (8 * r + 4 * h, (8, 1), (1, 4)) for r in range(4) for h in range(2)] + [
    (c, (8, 1), (4, 1)) for c in range(0, 8, 3)] + [(0, (8, 1), SHAPE)]


def _elements(region):
  off, estrides, shape = region
  idx = np.zeros(shape, np.int64) + off
  for d, (s, n) in enumerate(zip(estrides, shape)):
    idx += s * np.arange(n).reshape([-1 if i == d else 1 for i in range(len(shape))])
  return idx


class Model:
  """Per element: last plain writer, last atomic writer and the last atomic
  writer of another block than that one, first two distinct reading blocks,
  each (block number + 1, site) or None; reads before the
  buffer's first write logged per region (its first two blocks) and
  replayed at it."""

  def __init__(self, log, buf):
    self.log, self.buf = log, buf
    n = buf.data.size
    self.w, self.a, self.a2, self.r1, self.r2 = ([None] * n for _ in range(5))
    self.written = self.any_xread = self.any_atomic = False
    self.read_log = {}

  def _add_reader(self, elems, me, site):
    for e in elems.reshape(-1):
      if self.r1[e] is None:
        self.r1[e] = (me, site)
      elif self.r1[e][0] != me and self.r2[e] is None:
        self.r2[e] = (me, site)

  def access(self, number, block, region, site, write, atomic):
    me = number + 1
    elems = _elements(region)
    if not self.written:
      if not write:
        readers = self.read_log.setdefault(region, [])
        if len(readers) < 2 and all(r != me for r, _ in readers):
          readers.append((me, site))
        return
      self.written = True
      self.any_xread = bool(self.read_log)
      for reg, readers in self.read_log.items():
        for rme, rsite in readers:
          self._add_reader(_elements(reg), rme, rsite)
    checks = [(self.w, "write")]
    if self.any_atomic and (not atomic or not write):
      checks += [(self.a, "write"), (self.a2, "write")]
    if write and self.any_xread:
      checks += [(self.r1, "read"), (self.r2, "read")]
    for slot, prior in checks:
      held = [slot[e] for e in elems.reshape(-1)]
      mask = np.array([h is not None and h[0] != me for h in held]).reshape(elems.shape)
      if mask.any():
        rng = element_range(self.buf, region[0], region[1], mask)
        for first in sorted({h[1] for h, m in zip(held, mask.reshape(-1)) if m},
                            key=lambda s: s.id):
          kind = ("write-write" if prior == "write" and write else
                  "read-write" if prior == "read" else "write-read")
          # (the block of the first element's record at that site, named too)
          other = next(h[0] for h, m in zip(held, mask.reshape(-1)) if m and h[1] is first)
          self.log.add(f"{kind} race between blocks", first, site, block, rng,
                       advice(first, site, same_block=False), first_block=(other - 1,))
    if write:
      self.any_atomic |= atomic
      slot = self.a if atomic else self.w
      for e in elems.reshape(-1):
        if atomic and self.a[e] is not None and self.a[e][0] != me:
          self.a2[e] = self.a[e]
        slot[e] = (me, site)
      return
    self.any_xread = True
    self._add_reader(elems, me, site)


ACCESS = st.tuples(st.integers(0, 3), st.sampled_from(REGIONS), st.integers(0, 2),
                   st.booleans(), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(ACCESS, max_size=14))
def test_cross_block_reports_what_a_per_element_model_reports(accesses):
  runs = []
  for make in (CrossBlock, None):
    log = races.RaceLog("k")
    sites = [log.site("thread", "store", f"k.py:{i}", "out", "write", 0) for i in range(3)]
    buf = memory.Buffer("out", "gmem", np.zeros(SHAPE, np.float32))
    cross = make(log) if make else Model(log, buf)
    for number, region, s, write, atomic in accesses:
      atomic = atomic and write
      if make:
        cross.access(number, (number,), buf, region[0], region[1], region[2],
                     sites[s], write, atomic)
      else:
        cross.access(number, (number,), region, sites[s], write, atomic)
    runs.append([str(r) for r in log.races()])
  assert runs[0] == runs[1]
