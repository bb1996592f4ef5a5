"""Uninitialized memory, like compute-sanitizer's initcheck: which elements of
SMEM and of the kernel's outputs something wrote, reads of elements nothing
wrote before them, and output elements no block wrote by the end of the
launch.

A tracked buffer has a boolean mask `written` (its logical elements) and a
count of elements still unwritten; once that count reaches 0 the mask is
dropped (`written = None`), so a fully written buffer costs nothing more.
Untracked buffers (inputs, outputs aliased to inputs, accumulators, barriers)
have `written = None` from the start: they count as written.

Reads found here go to the group's event list, in order, as
base/events.py's Uninit, and fold per site when the executor merges
them (InitLog), like race reports. Decisions: a plain store (`swap`) only
writes (its old value is almost always dropped); `addupdate`, and a TMA
store with a reduction, read the destination first.
"""
import numpy as np

from pallas_sim.backends.sim.machine import memory
from pallas_sim.backends.sim.checks.races import Site, element_range, element_view, in_block
from pallas_sim.backends.sim.machine.aliasing import element_map


def track(buf):
  """From now on, `buf`'s elements count as unwritten until written."""
  if buf.data.dtype == object:  # barriers
    return
  buf.written = memory.base_pages(buf.data.shape, np.bool_)
  buf.unwritten = buf.data.size


def _mark(buf, m):
  new = m.size - np.count_nonzero(m)
  if new:
    m[...] = True
    buf.unwritten -= new
    if buf.unwritten == 0:
      buf.written = None


def mark_view(buf, off, estrides, shape):
  """A write of buf's elements under an element map."""
  if buf.written is not None:
    _mark(buf, element_view(buf.written, off, shape, estrides))


def unwritten_at(buf, off, estrides, shape):
  """Mask of the elements under an element map of `buf` that nothing wrote
  (as far as this buffer knows), or None."""
  if buf.written is None:
    return None
  m = element_view(buf.written, off, shape, estrides)
  return None if m.all() else ~m


def unwritten_of(buf, off, estrides, shape, mask):
  """Text naming the elements of `mask` (under an element map of `buf`)
  that are unwritten in `buf` too, or None."""
  if buf.written is not None:
    mask = mask & ~element_view(buf.written, off, shape, estrides)
    if mask.any():
      return element_range(buf, off, estrides, mask)
  return None


def copy_state(src, dst):
  """A group's private copy of a GMEM buffer starts with its mask."""
  dst.written = None if src.written is None else src.written.copy()
  dst.unwritten = src.unwritten


def unwritten_in(ref):
  """Text naming the elements under `ref` that nothing wrote, or None."""
  buf = ref.buf
  if buf.written is None or ref.view.size == 0:
    return None
  off, estrides, shape = element_map(buf, ref.view)
  m = unwritten_at(buf, off, estrides, shape)
  return None if m is None else element_range(buf, off, estrides, m)


class Uninitialized:
  """One folded finding: an uninitialized read at a site (with an example
  and how often), or an output that no block wrote in full. `cause`: a
  race of the launch that explains it (link_causes), or None."""

  def __init__(self, kind, buffer, text, site=None, example=None):
    self.kind = kind        # "uninitialized read" | "unwritten output"
    self.buffer = buffer
    self.text = text
    self.site = site        # races.Site of the read, or None
    self.example = example  # (block, element range) of the first read
    self.count = 1
    self.cause = None
    self.call_site = ""  # the user's call of a kernel defined outside their files
    self.kernel = ""  # the launch's kernel and its file:line (findings.conclude)
    # Whether what it read reaches the outputs, from the launch run again
    # with other bits in that memory: None (not known), () (no: harmless
    # there), or (output, element) that came out different
    self.reaches = None
    self.smem = False  # a read of SMEM

  @property
  def where(self):
    return self.site.where if self.site is not None else None

  def cause_text(self):
    r = self.cause
    if r is None:
      return ""
    if self.site is not None:
      other = r.first if r.second.where == self.site.where else r.second
      return (f"\n    cause: this read races with the {other.describe()} (a {r.kind}, "
              "in report.races / err.races): those elements were still being "
              "written, not left unwritten; ordering the two fixes both findings")
    return (f"\n    see also: the {r.kind} on {self.buffer} between {r.first.who} "
            f"({r.first.where}) and {r.second.who} ({r.second.where}) (in "
            "report.races / err.races): threads that write the same elements "
            "may be writing where others were meant to")

  def __str__(self):
    if self.site is None:
      return f"{self.kind}: {self.text}" + self.cause_text()
    block, rng = self.example
    text = self.text if self.cause is None else "nothing had written these elements yet"
    called = f"\n    the kernel was called from {self.call_site}" if self.call_site else ""
    return (f"{self.kind} of {self.buffer} {rng}{in_block(f'block {block}', self.count)}:\n"
            f"    {self.site.describe()}\n    {text}" + self.cause_text()
            + self.reach_text() + called)

  @property
  def harmless(self):
    """An uninitialized read whose values reach no element the launch wrote."""
    return self.reaches == ()

  def reach_text(self):
    if self.reaches is None:
      return ""
    if self.reaches == ():
      return ("\n    harmless in this launch: run again with other bits in the "
              "memory nothing wrote, every output element it wrote came out the same")
    out, at = self.reaches
    return (f"\n    it reaches the outputs: run again with other bits in the memory "
            f"nothing wrote, {out}{list(at)} came out different")


def link_causes(findings, races):
  """Each finding a race of the launch explains points to it: a read of
  elements that a write racing with it was to fill (an in-flight TMA load,
  a wgmma, another block's TMA store), or an output left partly unwritten
  while writes to it race with each other (threads writing one element
  that were meant to write several)."""
  for f in findings:
    for r in races:
      if r.first is None:
        continue
      if f.site is not None:
        for mine, other in ((r.second, r.first), (r.first, r.second)):
          if (mine.where, mine.buffer, mine.thread, mine.access) == (
              f.site.where, f.site.buffer, f.site.thread, "read") and other.access == "write":
            f.cause = r
            break
      elif (r.kind.startswith("write-write") and r.first.buffer == r.second.buffer
            == f.buffer):
        f.cause = r
      if f.cause is not None:
        break


def also_found(items, kind):
  """The lines an error raised for one kind of finding ends with, naming the
  launch's findings of the other `kind` ("races" or "uninitialized")."""
  if not items:
    return ""
  lines = []
  for x in items:
    if kind == "races":  # (x: an uninitialized finding)
      at = f" at {x.where}" if x.where else ""
      how = "caused by" if x.site is not None else "see"
      lines.append(f"  {x.kind} of {x.buffer}{at}"
                   + (f" ({how} the {x.cause.kind} above)" if x.cause else ""))
    else:
      sides = " and ".join(s.where for s in (x.first, x.second) if s is not None)
      lines.append(f"  {x.kind} on {x.second.buffer} at {sides}")
  what = ("uninitialized-memory finding(s), in report.uninitialized" if kind == "races"
          else "race(s), in report.races")
  return f"\nThe launch also had {len(items)} {what}:\n" + "\n".join(lines)


class InitLog:
  """Sites and folded findings of one launch."""

  def __init__(self, call_site=""):
    self.sites = {}
    self.found = {}
    self.call_site = call_site  # (a kernel defined outside the user's files)

  def site(self, agent, prim, where, buffer, thread):
    key = (agent, prim, where, buffer, "read", thread)
    s = self.sites.get(key)
    if s is None:
      s = self.sites[key] = Site(len(self.sites), *key)
    return s

  def add(self, site, block, rng, smem=False):
    f = self.found.get(site.id)
    if f is not None:
      f.count += 1
      return
    why = ("nothing wrote these elements before this read in this launch (the "
           "hardware would read leftover bytes)")
    # (a TMA store reads GMEM only to add to it; its SMEM source is a plain read)
    if site.prim == "addupdate" or (site.prim == "copy_smem_to_gmem" and not smem):
      why += ("; it adds to what is there: "
              + ("write the buffer first" if smem else
                 "an output starts with whatever the memory held; pass its starting "
                 "values in (a jax.new_ref on jax 0.12.1, or pl.pallas_call's "
                 "input_output_aliases), or zero it in an earlier kernel"))
    f = self.found[site.id] = Uninitialized(
        "uninitialized read", site.buffer, why, site, (block, rng))
    f.call_site = self.call_site
    f.smem = smem

  def unwritten_output(self, buf, grid, may_stay=None):
    """A finding for an output that some elements of were never written,
    outside the elements `may_stay` (a mask: ps.leave_unwritten) marks."""
    if buf.written is None:
      return
    unwritten = ~buf.written
    if may_stay is not None:
      unwritten &= ~may_stay
      if not unwritten.any():
        return
    shape = buf.data.shape
    boxes = _boxes(unwritten)
    shown = ", ".join(_slice_text(b) for b in boxes[:3]) + (
        f" and {len(boxes) - 3} more regions" if len(boxes) > 3 else "")
    bounds = _bounds(buf.written)
    covers = (f"; what the grid {tuple(grid)} wrote lies within {_slice_text(bounds)}"
              if bounds else f"; no block of the grid {tuple(grid)} wrote it")
    n = int(np.count_nonzero(unwritten))
    what = f"{buf.name}{shown}" if len(boxes) == 1 else f"{buf.name} regions {shown}"
    text = (f"{what} of shape {tuple(shape)}: {n} of {buf.data.size} elements were "
            f"never written{covers} (the hardware leaves whatever the memory held)"
            + ("; that is besides the region declared with ps.leave_unwritten"
               if may_stay is not None else ""))
    self.found[("out", buf.name)] = Uninitialized("unwritten output", buf.name, text)

  def findings(self):
    return list(self.found.values())

  def smem_reads(self):
    """Whether the launch read SMEM nothing wrote (a read of an output
    before it is written is a mistake whatever comes of it)."""
    return any(f.smem for f in self.found.values())


def _bounds(mask):
  """Per axis (first, last + 1) of mask's True elements, or None."""
  out = []
  for d in range(mask.ndim):
    hit = np.flatnonzero(mask.any(axis=tuple(a for a in range(mask.ndim) if a != d)))
    if not len(hit):
      return None
    out.append((hit[0], hit[-1] + 1))
  return out


def _slice_text(box):
  return "[" + ", ".join(f"{int(a)}:{int(b)}" for a, b in box) + "]"


def _boxes(mask, limit=64):
  """Boxes (per axis (start, stop)) covering exactly mask's True elements:
  runs of equal slices along the first axis, split further inside. Stops
  splitting after `limit` boxes (the rest are merged into their bounds)."""
  if mask.ndim == 0:
    return [()] if mask else []
  out: list[tuple[tuple[int | np.integer, int | np.integer], ...]] = []
  n = mask.shape[0]
  i = 0
  while i < n:
    if not mask[i].any():
      i += 1
      continue
    j = i + 1
    while j < n and np.array_equal(mask[j], mask[i]):
      j += 1
    if len(out) >= limit:
      rest = np.argwhere(mask[i:])
      lo, hi = rest.min(0), rest.max(0) + 1
      out.append(((i + lo[0], i + hi[0]),) + tuple(zip(lo[1:], hi[1:])))
      return out
    for sub in _boxes(mask[i], limit):
      out.append(((i, j),) + sub)
    i = j
  return out
