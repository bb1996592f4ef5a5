"""SMEM aliasing (plgpu.RefUnion): the union is one byte buffer; each member
is a view of it at the lowering's byte offset (the `ExtractAliasedRef`
transform), so writes through one member are seen through the others, and
race detection and the uninitialized-memory check work per byte of it.

A member's view holds its elements in logical (row-major) order. Where the
member's tiling or swizzle puts them in another physical order on the GPU,
bytes written through it can be read back exactly only through a member of
the same layout. Every byte records the layout it was last written through;
reading bytes written through a member of another physical order raises
UnsupportedPrimitiveError instead of returning values the GPU would not.
"""
import numpy as np

from pallas_sim.backends.sim.machine.races import element_map
from pallas_sim.errors import UnsupportedPrimitiveError

UNWRITTEN, TRIVIAL = 0, 1  # (TRIVIAL: row-major, the physical order is the logical one)


class Layout:
  """A member's tiling and swizzle, and the tag of its physical order."""
  __slots__ = ("tiling", "swizzle", "tag", "text")

  def __init__(self, tiling, swizzle, tag, text):
    self.tiling, self.swizzle, self.tag, self.text = tiling, swizzle, tag, text


class Aliases:
  """A union buffer's bytes: the layout tag each was last written through."""
  __slots__ = ("tags", "layouts")

  def __init__(self, nbytes):
    self.tags = np.zeros(nbytes, np.uint8)
    self.layouts = {}   # signature -> Layout tag (from 2)


def physical_is_logical(shape, tiling, swizzle):
  """Whether a tiled/swizzled array's bytes lie in row-major logical order:
  no swizzle, and tiles that are whole rows of the minor dimensions."""
  if swizzle is not None:
    return False
  if tiling is None:
    return True
  return all(t == d for t, d in zip(tiling[1:], shape[len(shape) - len(tiling) + 1:]))


def layout_for(buf, dtype, shape, tiling, swizzle):
  if buf.aliases is None:
    buf.aliases = Aliases(buf.data.nbytes)
  text = f"{np.dtype(dtype).name}{list(shape)} tiling={tiling} swizzle={swizzle}"
  if physical_is_logical(shape, tiling, swizzle):
    return Layout(tiling, swizzle, TRIVIAL, text)
  sig = (np.dtype(dtype).str, tuple(shape), tuple(tiling or ()), swizzle)
  tag = buf.aliases.layouts.setdefault(sig, len(buf.aliases.layouts) + 2)
  if tag > 255:
    raise UnsupportedPrimitiveError(f"more than 255 layouts alias {buf.name}")
  return Layout(tiling, swizzle, tag, text)


def _bytes(ref):
  """The byte range [lo, hi) of the union that ref's view covers (the union
  is a byte array, so its elements are bytes)."""
  off, estrides, shape = element_map(ref.buf, ref.view)
  return off, off + sum((d - 1) * abs(s) for d, s in zip(shape, estrides)) + 1


def wrote(ref):
  if ref.layout is not None:
    lo, hi = _bytes(ref)
    ref.buf.aliases.tags[lo:hi] = ref.layout.tag


def read(ref):
  if ref.layout is None:
    return
  lo, hi = _bytes(ref)
  tags = ref.buf.aliases.tags[lo:hi]
  mine = ref.layout.tag
  if np.any((tags != UNWRITTEN) & (tags != mine)):
    raise UnsupportedPrimitiveError(
        f"a read of {ref.buf.name} through an aliased ref ({ref.layout.text}) of "
        "bytes written through a member whose tiling or swizzle lays them out in "
        "another order: the simulator keeps members in logical order, so it "
        "cannot give the values the GPU would")
