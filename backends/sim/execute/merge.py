"""Group results folded into a launch's, in block order: cycles and
statistics per block, events (events.py: race reports, cross-block
accesses, uninitialized reads) and a detached group's GMEM writes."""
from collections.abc import Sequence
from typing import Any

import numpy as np

from pallas_sim.backends.sim.checks import initcheck
from pallas_sim.backends.sim.checks.cross_block import CrossBlock
from pallas_sim.backends.sim.checks.races import element_view
from pallas_sim.backends.sim.execute.group import GroupResult
from pallas_sim.backends.sim.machine.state import BlockStats


class Merge:
  """What a launch's groups add up to so far."""
  # (events.UninitGmem: the range of a group's unwritten reads that no
  # earlier group's write reached)
  unwritten_of = staticmethod(initcheck.unwritten_of)

  def __init__(self, num_blocks: int, log: Any, call_site: str, check_races: bool) -> None:
    self.log = log                      # races.RaceLog: intra-group reports fold here
    self.init_log = initcheck.InitLog(call_site)
    self.cross = CrossBlock(log) if check_races else None
    self.cycles = np.zeros(num_blocks)  # per block: when it ended
    self.totals = BlockStats()          # summed over the launch's blocks
    self.loads: dict[int, Any] = {}  # block number -> its TMA loads, where the L2 model follows them
    # group number -> {semaphore acquire: the signals it needs}, where a
    # group's acquires took more (events.SemaphoreNeeds)
    self.sem_needs: dict[int, Any] = {}
    # copy's line -> what to say of a TMA box wholly outside its array
    # (events.BoxOutside)
    self.outside: dict[str, str] = {}

  def group(self, result: GroupResult) -> None:
    """Merges a group's result (group.GroupResult)."""
    for number, c, st in zip(result.numbers, result.cycles, result.stats):
      self.cycles[number] = c
      self.totals.add(st)
      if st.loads is not None:
        self.loads[number] = st.loads
    for ev in result.events:
      ev.merge(self)
    for w in result.writes:
      view = element_view(w.buffer.data, w.offset, w.shape, w.estrides)
      view[...] = w.values if w.reduce is None else w.reduce(view, w.values)
      initcheck.mark_view(w.buffer, w.offset, w.estrides, w.shape)

  def same_as(self, members: Sequence[Any], result: GroupResult, found: Any = None) -> None:
    """Group `members` took the times of `result`, its class's group (and,
    with the blocks' paths `found`, its loads' issue cycles)."""
    for (number, _, _), c, st in zip(members, result.cycles, result.stats):
      self.cycles[number] = c
      self.totals.add(st)
      if found is not None and st.loads is not None:
        self.loads[number] = found.joined(number, st.loads)
