"""A TMA load as the L2 model follows it: the timing model records it when a
block runs, a path slice (blocks/paths.py) when it runs with no time; a
block that was not simulated has its slice's loads joined to its class's
cycles."""
import typing


class Load(typing.NamedTuple):
  """One TMA load as the L2 model follows it (hbm_reads_traced): issued at
  `cycle` (None in a path slice's run, which keeps no time:
  blocks/paths.py), reading `nbytes` from `source` (buffer, byte offset,
  box) for Pallas thread `thread` at load site `site`."""
  cycle: float | None
  source: tuple
  nbytes: int
  thread: int | str
  site: int


class Joined(typing.NamedTuple):
  """A block's loads at the cycles of its class's simulated block
  (blocks/paths.py Paths.joined): the slice's Loads (no cycles) and, one for
  one, their issue cycles. (A persistent kernel's blocks issue thousands of
  loads each: not copied into Loads of their own.)"""
  cycles: list
  sliced: list
