"""What a group of blocks hands the merge, in order (group.GroupResult):
findings and GMEM traffic as typed events, and the writes of a detached
group. The merge applies each event through `merge(m)` (merge.Merge), in
block order, whether the group ran here or in a worker process.

An event that crosses a process boundary holds two kinds of objects a
worker cannot send as they are: GMEM buffers (sent as their position among
the launch's operands) and race sites (sent as their key in the launch's
RaceLog). `portable` and `restored` do that, naming the fields they map:
adding a field to an event needs no index table anywhere else."""
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, Self


class SiteLog(Protocol):
  """The launch's race log (checks/races.RaceLog): a site by its key."""

  def site(self, *key: Any) -> Any: ...


class MergeTarget(Protocol):
  """What an event merges into (execute/merge.Merge)."""
  log: Any          # races.RaceLog
  init_log: Any     # initcheck.InitLog
  cross: Any        # cross_block.CrossBlock, or None without race checking
  sem_needs: dict[int, Any]
  outside: dict[str, str]

  def unwritten_of(self, origin: Any, offset: int, estrides: tuple[int, ...],
                   shape: tuple[int, ...], unwritten: Any) -> Any: ...


# A buffer's position among the launch's operands, from the buffer.
BufIndex = Callable[[Any], int]


class RaceFound(NamedTuple):
  """A race or a misuse within a group (checks/races.py, checks/observer.py,
  group.Group.misuse): `first` is None for a misuse with one site."""
  kind: str
  first: Any       # races.Site or None
  second: Any      # races.Site
  block: tuple[int, ...]
  elements: str
  advice: str
  timing: Any = None

  def merge(self, m: MergeTarget) -> None:
    m.log.add(self.kind, self.first, self.second, self.block, self.elements, self.advice,
              self.timing)

  def portable(self, buf_index: BufIndex) -> Self:
    return self._replace(first=_key(self.first), second=_key(self.second))

  def restored(self, bufs: Sequence[Any], log: SiteLog) -> Self:
    return self._replace(first=_site(self.first, log), second=_site(self.second, log))


class GmemAccess(NamedTuple):
  """An access to GMEM, for the races between blocks (checks/cross_block.py)."""
  group: int
  block: tuple[int, ...]
  buffer: Any      # memory.Buffer
  offset: int
  estrides: tuple[int, ...]
  shape: tuple[int, ...]
  site: Any        # races.Site
  write: bool
  atomic: bool

  def merge(self, m: MergeTarget) -> None:
    if m.cross is not None:
      m.cross.access(self.group, self.block, self.buffer, self.offset, self.estrides,
                     self.shape, self.site, self.write, self.atomic)

  def portable(self, buf_index: BufIndex) -> Self:
    return self._replace(buffer=buf_index(self.buffer), site=_key(self.site))

  def restored(self, bufs: Sequence[Any], log: SiteLog) -> Self:
    return self._replace(buffer=bufs[self.buffer], site=_site(self.site, log))


class Uninit(NamedTuple):
  """A read of SMEM (or of GMEM in a group that shares the launch's) that
  nothing wrote before it (checks/initcheck.py)."""
  agent: str
  primitive: str
  where: str
  buffer_name: str
  thread: int
  block: tuple[int, ...]
  elements: str
  smem: bool = False

  def merge(self, m: MergeTarget) -> None:
    m.init_log.add(m.init_log.site(self.agent, self.primitive, self.where,
                                   self.buffer_name, self.thread), self.block, self.elements,
                   self.smem)

  def portable(self, buf_index: BufIndex) -> Self:
    return self

  def restored(self, bufs: Sequence[Any], log: SiteLog) -> Self:
    return self


class UninitGmem(NamedTuple):
  """A detached group's read of GMEM elements its own copy did not have
  written: the merge decides against the launch's buffers, which earlier
  groups' writes reached."""
  agent: str
  primitive: str
  where: str
  thread: int
  buffer: Any
  block: tuple[int, ...]
  offset: int
  estrides: tuple[int, ...]
  shape: tuple[int, ...]
  unwritten: Any   # mask of the elements unwritten in the group's copy

  def merge(self, m: MergeTarget) -> None:
    rng = m.unwritten_of(self.buffer.origin, self.offset, self.estrides, self.shape,
                         self.unwritten)
    if rng is not None:
      m.init_log.add(m.init_log.site(self.agent, self.primitive, self.where,
                                     self.buffer.name, self.thread), self.block, rng)

  def portable(self, buf_index: BufIndex) -> Self:
    return self._replace(buffer=buf_index(self.buffer))

  def restored(self, bufs: Sequence[Any], log: SiteLog) -> Self:
    return self._replace(buffer=bufs[self.buffer])


class SemaphoreNeeds(NamedTuple):
  """A group's semaphore acquires, where one of them acquired more signals
  than it needs: the signals each needs, by key (checks/semaphore_order.py),
  for the launch's next run."""
  group: int
  needs: dict

  def merge(self, m: MergeTarget) -> None:
    m.sem_needs[self.group] = self.needs

  def portable(self, buf_index: BufIndex) -> Self:
    return self

  def restored(self, bufs: Sequence[Any], log: SiteLog) -> Self:
    return self


class GmemRead(NamedTuple):
  """What a detached group read of GMEM (parallel.Visibility)."""
  buffer: Any
  offset: int
  estrides: tuple[int, ...]
  shape: tuple[int, ...]

  def merge(self, m: MergeTarget) -> None:
    pass

  def portable(self, buf_index: BufIndex) -> Self:
    return self._replace(buffer=buf_index(self.buffer))

  def restored(self, bufs: Sequence[Any], log: SiteLog) -> Self:
    return self._replace(buffer=bufs[self.buffer])


class GmemWrite(NamedTuple):
  """A detached group's write to GMEM: the values written or, for a
  reduction (atomics, TMA reductions), the reduction and its operand,
  replayed on the launch's buffer at the merge."""
  buffer: Any
  offset: int
  estrides: tuple[int, ...]
  shape: tuple[int, ...]
  reduce: Any      # combine(old, operand) or None
  values: Any

  def portable(self, buf_index: BufIndex) -> Self:
    return self._replace(buffer=buf_index(self.buffer))

  def restored(self, bufs: Sequence[Any], log: SiteLog) -> Self:
    return self._replace(buffer=bufs[self.buffer])


def _key(site: Any) -> Any:
  return None if site is None else site.key


def _site(key: Any, log: SiteLog) -> Any:
  return None if key is None else log.site(*key)


class BoxOutside(NamedTuple):
  """A TMA copy whose box lay wholly outside its array (rules/tma.py): the
  copy's line and what to say of it, the first one a launch met at that
  line kept (findings.py warns of it)."""
  where: str
  text: str

  def merge(self, m: MergeTarget) -> None:
    m.outside.setdefault(self.where, self.text)

  def portable(self, buf_index: BufIndex) -> Self:
    return self

  def restored(self, bufs: Sequence[Any], log: SiteLog) -> Self:
    return self
