"""Which integers of a kernel are multiples of what, and within which
bounds, read off its jaxpr: for block_classes, whether a TMA box whose
start depends on the block can reach past the array's end (TMA cuts it
there, or moves nothing: fewer bytes, another time).

Each integer value gets (m, r, lo, hi): the value is r modulo m in every
block and every loop trip (m == 0: it is r exactly; m == 1 says nothing),
and lies in [lo, hi] (None: unbounded). `pl.ds(b * 128 + 64 * k, 128)`
starts at a multiple of 64 (m = 64): of 128 only where m is 128 or a
multiple of it. The grid index is bounded by the grid; sums, differences
and products carry their operands' congruences and bounds, remainders and
quotients by a bounded divisor theirs (lax.rem(b, 4) lies in [0, 3]); a loop's
carries and a cond's outputs take the join of what reaches them (the gcd,
the hull); anything else says nothing. (int32 arithmetic that wraps would
break a congruence by anything but a power of two: box starts do not.)"""
import math

import numpy as np

from pallas_sim.backends.sim.analysis import walker

TOP = (1, 0, None, None)


def exactly(value):
  return (0, int(value), int(value), int(value))


def _norm(m, r, lo, hi):
  m = abs(int(m))
  return (m, int(r) % m if m else int(r), lo, hi)


def _hull(x, y, pick):
  return None if x is None or y is None else pick(x, y)


def join(a, b):
  """What both a and b satisfy."""
  return _norm(math.gcd(a[0], b[0], a[1] - b[1]), a[1],
               _hull(a[2], b[2], min), _hull(a[3], b[3], max))


def add(a, b, sign=1):
  lo, hi = (b[2], b[3]) if sign > 0 else (_neg(b[3]), _neg(b[2]))
  return _norm(math.gcd(a[0], b[0]), a[1] + sign * b[1],
               _hull(a[2], lo, int.__add__), _hull(a[3], hi, int.__add__))


def widen(old, new):
  """A loop carry's next guess: the join, with any bound that moved given
  up (a loop counter's would grow a step a round)."""
  j = join(old, new)
  return j[:2] + (j[2] if j[2] == old[2] else None, j[3] if j[3] == old[3] else None)


def _neg(x):
  return None if x is None else -x


def _mul(a, b):
  (m1, r1, lo1, hi1), (m2, r2, lo2, hi2) = a, b
  bounds = (None, None)
  if None not in (lo1, hi1, lo2, hi2):
    corners = [x * y for x in (lo1, hi1) for y in (lo2, hi2)]
    bounds = (min(corners), max(corners))
  return _norm(math.gcd(m1 * m2, m1 * r2, m2 * r1), r1 * r2, *bounds)


def is_multiple(c, size):
  """Whether a value of c is a multiple of size, always."""
  return c[1] % size == 0 and c[0] % size == 0


class Starts:
  """The walk's result: for each equation (by id), the join of its inputs'
  congruences over every time it was walked."""

  def __init__(self, grid=None):
    self.ins = {}
    self.grid = dict(grid or {})  # (axis -> size: the indices' bounds)

  def of(self, eqn):
    return self.ins.get(id(eqn))


def analyse(jaxpr, grid=None):
  """`grid`: axis name -> its size, which bounds the grid index."""
  starts = Starts(grid)
  _Congruences(starts).walk(jaxpr, [TOP] * (len(jaxpr.constvars) + len(jaxpr.invars)))
  return starts


def _literal(v):
  val = np.asarray(v.val)
  if val.shape == () and np.issubdtype(val.dtype, np.integer):
    return exactly(val)
  return TOP


class _Congruences(walker.Forward):
  """The walk: each value's congruence; each equation's inputs' joined in
  `starts` over every time it is walked. What several bodies give, or a
  value that may be any of several, says nothing (TOP)."""

  unknown = TOP

  def __init__(self, starts):
    self.starts = starts

  def literal(self, v):
    return _literal(v)

  def join(self, a, b):
    return join(a, b)

  def widen(self, old, new):
    return widen(old, new)

  def entering(self, eqn, cs):
    seen = self.starts.ins.get(id(eqn))
    self.starts.ins[id(eqn)] = cs if seen is None else [join(a, b) for a, b in zip(seen, cs)]

  def transfer(self, eqn, cs):
    return _eqn(eqn, cs, self.starts)

  def scan(self, eqn, form, cs):
    return _scan(eqn, form, cs, self)

  def returned(self, eqn, ins, results):
    """One body's results by position (jit, maps: where they agree)."""
    if len(results) == 1 and len(results[0]) == len(eqn.outvars):
      return results[0]
    return [TOP] * len(eqn.outvars)


_ARITH = {"add": add, "sub": lambda a, b: add(a, b, -1), "mul": _mul}


def _max(a, b):
  """max(a, b): at least either's lowest; at most the larger highest."""
  lows = [x for x in (a[2], b[2]) if x is not None]
  return join(a, b)[:2] + (max(lows) if lows else None, _hull(a[3], b[3], max))


def _min(a, b):
  highs = [x for x in (a[3], b[3]) if x is not None]
  return join(a, b)[:2] + (_hull(a[2], b[2], min), min(highs) if highs else None)


def _rem(a, d):
  """rem(a, d), truncating (the sign of a): a's congruence modulo a divisor
  it shares with d (a - rem is a multiple of d); under d's largest size
  (the simulator's rem by 0 is 0, within that too)."""
  m = math.gcd(a[0], d[1]) if d[0] == 0 and d[1] != 0 else 1
  if d[2] is None or d[3] is None:
    return _norm(m, a[1], None, None)
  top = max(0, abs(d[2]) - 1, abs(d[3]) - 1)
  lo = 0 if a[2] is not None and a[2] >= 0 else -top
  hi = 0 if a[3] is not None and a[3] <= 0 else top
  if a[2] is not None and a[3] is not None:  # (|rem| <= |a|)
    lo, hi = max(lo, min(a[2], 0)), min(hi, max(a[3], 0))
  return _norm(m, a[1], lo, hi)


def _div(a, d):
  """div(a, d), truncating toward zero, by a constant: a's bounds divided."""
  if d[0] != 0 or d[1] == 0 or a[2] is None or a[3] is None:
    return TOP
  c = d[1]
  q = [(abs(x) // abs(c)) * (1 if (x >= 0) == (c > 0) else -1) for x in (a[2], a[3])]
  return (1, 0, min(q), max(q))


def _eqn(eqn, cs, starts):
  name = eqn.primitive.name
  p = eqn.params
  n = len(eqn.outvars)
  if name in _ARITH and len(cs) == 2:
    return [_ARITH[name](*cs)]
  if name == "neg":
    return [add(exactly(0), cs[0], -1)]
  if name == "rem" and len(cs) == 2:
    return [_rem(*cs)]
  if name == "div" and len(cs) == 2:
    return [_div(*cs)]
  if name == "max":
    return [_max(*cs)]
  if name == "min":
    return [_min(*cs)]
  if name == "clamp":  # (clamp(lo, x, hi))
    return [_min(_max(cs[0], cs[1]), cs[2])]
  if name == "select_n":  # (one of the cases)
    out = cs[1]
    for c in cs[2:]:
      out = join(out, c)
    return [out]
  if name == "multiple_of":  # (the user's promise, as the lowering takes it)
    m = math.lcm(*p["values"]) if p.get("values") else 1
    return [cs[0] if is_multiple(cs[0], m) else (m, 0) + cs[0][2:]]
  if name in ("axis_index", "program_id"):
    axis = p.get("axis_name", p.get("axis"))
    if isinstance(axis, (tuple, list)):
      axis = axis[0] if len(axis) == 1 else None
    size = starts.grid.get(axis)
    return [(1, 0, 0, size - 1) if size else TOP] * n
  if name == "convert_element_type" and _widens(eqn.invars[0], eqn.outvars[0]):
    return [cs[0]]
  return [TOP] * n


def _scan(eqn, form, cs, walk):
  """lax.scan: its carries join what the body gives back; the per-trip
  inputs say nothing (an xs element is any of them). A carry whose bounds
  move by the same step each trip (a loop counter, a wrapping index) keeps
  them, over the scan's length (_stepped); the others' are given up."""
  if form.counts is None:
    return [TOP] * len(eqn.outvars)
  consts, carry, xs = form.split(cs)
  ncar = len(carry)
  xs = [TOP] * len(xs)
  run = lambda c: walk.walk(form.body, consts + c + xs)[:ncar]
  pinned, carry = _stepped(run, carry, form.length)
  while True:
    res = run(carry)
    new = [join(c, t)[:2] + c[2:] if j in pinned else widen(c, t)
           for j, (c, t) in enumerate(zip(carry, res))]
    if new == carry:
      break
    carry = new
  # (after the last trip: one step further)
  out = [c[:2] + (_hull(c[2], t[2], min), _hull(c[3], t[3], max)) if j in pinned else c
         for j, (c, t) in enumerate(zip(carry, res))]
  return out + [TOP] * (len(eqn.outvars) - ncar)


def _stepped(run, carry, length):
  """The carries whose bounds move by a constant step a trip: (their
  positions, the carries with those bounds spread over `length` trips).
  The step is what one trip does to the initial bounds, checked again on
  the spread ones (a counter, i + 1, or an index that wraps to 0, does the
  same to both)."""
  if not length or length < 2:
    return set(), carry
  first = run(carry)
  spread = list(carry)
  steps = {}
  for j, (c, t) in enumerate(zip(carry, first)):
    if None in (c[2], c[3], t[2], t[3]):
      continue
    lo, hi = t[2] - c[2], t[3] - c[3]
    n = length - 1
    steps[j] = (lo, hi)
    spread[j] = join(c, t)[:2] + (c[2] + min(0, lo * n), c[3] + max(0, hi * n))
  if not steps:
    return set(), carry
  again = run(spread)
  pinned = {j for j, (lo, hi) in steps.items()
            if None not in again[j][2:]
            and (again[j][2] - spread[j][2], again[j][3] - spread[j][3]) == (lo, hi)}
  return pinned, [s if j in pinned else c for j, (s, c) in enumerate(zip(spread, carry))]


def _widens(src, dst):
  """Whether an integer conversion keeps every value (int8 -> int32 does;
  int32 -> int8 wraps)."""
  a, b = (getattr(v.aval, "dtype", None) for v in (src, dst))
  if hasattr(src.aval, "inner_aval") or a is None or b is None:
    return False
  a, b = np.dtype(a), np.dtype(b)
  return a.kind in "iu" and b.kind in "iu" and np.can_cast(a, b, "safe")
