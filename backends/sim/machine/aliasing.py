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
import math
from typing import Any

import numpy as np

from pallas_sim.errors import UnsupportedPrimitiveError

UNWRITTEN, TRIVIAL = 0, 1  # (TRIVIAL: row-major, the physical order is the logical one)


class Layout:
  """A member's tiling and swizzle, and the tag of its physical order."""
  __slots__ = ("tiling", "swizzle", "tag", "text")

  def __init__(self, tiling, swizzle, tag, text):
    self.tiling, self.swizzle, self.tag, self.text = tiling, swizzle, tag, text


class Aliases:
  """A union buffer's bytes: the layout tag each was last written through."""
  __slots__ = ("tags", "layouts", "members")

  def __init__(self, nbytes):
    self.tags = np.zeros(nbytes, np.uint8)
    self.layouts = {}   # signature -> Layout tag (from 2)
    self.members = {}   # (offset, dtype, shape) -> Buffer of a 4-bit member


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
  _check(ref.buf, lo, hi, ref.layout)


def _check(buf, lo, hi, layout):
  tags = buf.aliases.tags[lo:hi]
  if np.any((tags != UNWRITTEN) & (tags != layout.tag)):
    raise UnsupportedPrimitiveError(
        f"a read of {buf.name} through an aliased ref ({layout.text}) of "
        "bytes written through a member whose tiling or swizzle lays them out in "
        "another order: the simulator keeps members in logical order, so it "
        "cannot give the values the GPU would")


# --- members of 4-bit types -------------------------------------------------
# Two elements share a byte (the first in its low nibble), so such a member
# cannot be a numpy view of the union's bytes. It is a buffer of its own, one
# element per byte, unpacked from the union's bytes whenever a ref to it is
# made, and packed back into them after every write (group.wrote). Races
# between it and the union's other members are not seen (its accesses are
# checked against its own buffer only).

class Packed:
  """Where a 4-bit member's buffer lies in its union."""
  __slots__ = ("union", "offset", "nbytes", "layout")

  def __init__(self, union, offset, nbytes, layout):
    self.union, self.offset, self.nbytes, self.layout = union, offset, nbytes, layout


def nibble_member(buf, offset, dtype, shape, layout):
  """The Buffer of `buf`'s 4-bit member at byte `offset`, holding the
  union's current bytes."""
  from pallas_sim.backends.sim.machine import memory
  n = math.prod(shape)
  nbytes = (n + 1) // 2
  key = (offset, np.dtype(dtype).str, tuple(shape))
  member = buf.aliases.members.get(key)
  if member is None:
    member = memory.Buffer(f"{buf.name} as {np.dtype(dtype).name}{list(shape)}",
                           buf.space, np.zeros(shape, dtype), layout.tiling,
                           layout.swizzle)
    member.packed = Packed(buf, offset, nbytes, layout)
    buf.aliases.members[key] = member
  raw = buf.data.view(np.uint8)[offset:offset + nbytes]
  nib = np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(-1)[:n]
  member.data.reshape(-1).view(np.uint8)[...] = nib
  if buf.written is not None:  # (an element is written where its byte is)
    member.written = np.repeat(buf.written[offset:offset + nbytes], 2)[:n].reshape(shape)
    member.unwritten = n - int(np.count_nonzero(member.written))
    if member.unwritten == 0:
      member.written = None
  else:
    member.written, member.unwritten = None, 0
  return member


def read_packed(member):
  """A read through a 4-bit member: of bytes written through its layout."""
  p = member.packed
  _check(p.union, p.offset, p.offset + p.nbytes, p.layout)


def pack(member):
  """After a write through a 4-bit member: its elements back into the
  union's bytes."""
  p = member.packed
  nib = member.data.reshape(-1).view(np.uint8) & 0xF
  if nib.size % 2:
    nib = np.append(nib, 0)
  raw = p.union.data.view(np.uint8)
  raw[p.offset:p.offset + p.nbytes] = nib[0::2] | (nib[1::2] << 4)
  p.union.aliases.tags[p.offset:p.offset + p.nbytes] = p.layout.tag
  if p.union.written is not None:
    done = (np.ones(p.nbytes, bool) if member.written is None
            else _bytes_written(member, p.nbytes))
    w = p.union.written[p.offset:p.offset + p.nbytes]
    new = np.count_nonzero(done & ~w)
    w |= done
    p.union.unwritten -= new
    if p.union.unwritten == 0:
      p.union.written = None


def _bytes_written(member, nbytes):
  """Bytes both of whose elements (the one, for an odd last) are written."""
  m = member.written.reshape(-1)
  if m.size % 2:
    m = np.append(m, True)
  return m.reshape(nbytes, 2).all(axis=1)


def element_map(buf: Any, view: Any) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
  """(offset, element strides, shape) of `view` in buf.data's elements, or a
  covering 1-D range when the view is a bitcast."""
  isz = buf.data.itemsize
  off_b = view.__array_interface__["data"][0] - buf.address()
  key = (view.strides, view.itemsize, isz)
  estrides: Any = _ESTRIDES.get(key)  # (False: a bitcast)
  if estrides is None:
    estrides = _ESTRIDES[key] = (
        tuple(s // isz for s in view.strides)
        if view.itemsize == isz and all(s % isz == 0 for s in view.strides) else False)
  if estrides is not False:
    return off_b // isz, estrides, view.shape
  lo = off_b // isz
  span = sum((d - 1) * abs(s) for d, s in zip(view.shape, view.strides)) + view.itemsize
  return lo, (1,), (-(-span // isz),)


# (byte strides, view itemsize, buffer itemsize) -> element strides (False: a bitcast)
_ESTRIDES: dict[tuple[Any, ...], Any] = {}
