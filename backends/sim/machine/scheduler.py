"""Discrete-event scheduler for one group of blocks (a block, or the blocks
of a cluster).

Agents that run code (warpgroups: Pallas threads) are tasks, coroutines that
run until they block and yield a `Wait`. Async work (TMA copies, wgmma
groups) is scheduled as events at its completion time. A task that yields is
re-queued at its own local time, so every async event that completes earlier
is applied before its wait is checked. When nothing is queued and a task is
still blocked, no event can ever unblock it: that is a deadlock, reported at
once, never a hang.
"""
import collections
import heapq
from typing import Any

from pallas_sim.errors import DeadlockError


# Runs a task keeps (Task.runs): enough to cover what a task that runs
# behind it has yet to reach.
RUNS_KEPT = 32


class Resource:
  """Something tasks wait on (a barrier slot, a warpgroup's async queue)."""
  __slots__ = ("name", "waiters")

  def __init__(self, name):
    self.name = name
    self.waiters = []


class Wait:
  """A wait request: blocks until `ready()`; `resources` are notified when
  their state changes; `what` and `where` describe it for deadlock reports
  (`what` a string, or a function that gives one from the state of what it
  waits on when the report is made)."""
  __slots__ = ("ready", "resources", "_what", "where")

  def __init__(self, ready, resources, what, where):
    self.ready = ready
    self.resources = resources
    self._what = what
    self.where = where

  @property
  def what(self):
    return self._what() if callable(self._what) else self._what


def _always():
  return True


def catch_up(what, where):
  """A wait that is always ready: the task goes back to the scheduler at
  its own clock, which first applies everything due before it."""
  return Wait(_always, (), what, where)


class Task:
  """A coroutine with a local clock (cycles). Subclassed by the warpgroup
  state (machine/state.py), which adds what the rules keep per warpgroup."""
  __slots__ = ("name", "gen", "time", "waiting", "queued", "done", "sched", "steps",
               "alu", "runs", "owed", "run_after")

  def __init__(self, name, sched):
    self.name = name
    self.steps = 0  # equations run (counted per program run, for progress)
    self.alu = 0.0  # cycles of issue work, as if alone on its SM (timing/model.py)
    # Its latest runs between waits, (start, end, alu work in it): what a
    # task that runs behind it in the simulation shares the SM's ALUs with
    # (timing/model.py alu_share).
    self.runs: collections.deque = collections.deque(maxlen=RUNS_KEPT)
    # ALU work it did beyond what the tasks that ran ahead of it left (at
    # its even share): theirs to lose, which it pays before it next waits
    self.owed = 0.0
    # where a wait is (None: its start) -> (alu work, span) of its run after
    # that wait, the last time: what it will likely do when it next resumes
    # there (alu_share)
    self.run_after: dict[Any, Any] = {}
    self.gen: Any = None  # its coroutine, once spawned
    self.sched = sched
    self.time = 0.0
    self.waiting = None
    self.queued = False
    self.done = False

  def step(self):
    self.queued = False
    sched = self.sched
    w = self.waiting
    if w is not None:
      if not w.ready():
        for r in w.resources:
          r.waiters.append(self)
        return
      self.waiting = None
      if sched.now > self.time:
        self.time = sched.now
    start, alu, site = self.time, self.alu, None if w is None else w.where
    try:
      req = self.gen.send(None)
    except StopIteration:
      self.done = True
      return
    finally:
      if self.owed:
        self.time += self.owed
        self.owed = 0.0
      if self.alu > alu:
        self.runs.append((start, self.time, self.alu - alu))
      self.run_after[site] = (self.alu - alu, self.time - start)
    self.waiting = req
    sched.wake(self, self.time)


class Scheduler:
  def __init__(self):
    self._heap = []
    self._seq = 0
    self.now = 0.0
    self.tasks = []

  def at(self, time, fn):
    self._seq += 1
    heapq.heappush(self._heap, (time, self._seq, fn))

  def idle(self):
    """Whether nothing is queued: no task ready, no async work in flight.
    A running task that changes nothing then leaves everything as it is."""
    return not self._heap

  def due_before(self, time):
    """Whether anything is queued to happen before `time`."""
    heap = self._heap
    return bool(heap) and heap[0][0] < time

  def wake(self, th, time):
    if not th.queued and not th.done:
      th.queued = True
      self.at(time, th.step)

  def notify(self, res, at=None):
    """`res` changed at time `at` (default: the current event's time; a task
    that changes it passes its own local clock, which runs ahead of the
    event that resumed it): its waiters resume no earlier than that."""
    ws = res.waiters
    if ws:
      res.waiters = []
      t = self.now if at is None else at
      for th in ws:
        self.wake(th, max(t, th.time))

  def spawn(self, th, gen):
    th.gen = gen
    self.tasks.append(th)
    self.wake(th, th.time)

  def run(self):
    heap = self._heap
    while heap:
      time, _, fn = heapq.heappop(heap)
      if time > self.now:
        self.now = time
      fn()
    blocked = [th for th in self.tasks if not th.done]
    if blocked:
      lines = [f"  {th.name}: blocked in {th.waiting.what} at {th.waiting.where}"
               for th in blocked]
      raise DeadlockError(
          "no thread can make progress (nothing left in flight that could "
          "unblock them):\n" + "\n".join(lines),
          blocked=[(th.name, th.waiting.what, th.waiting.where) for th in blocked],
          where=blocked[0].waiting.where)
    return max([th.time for th in self.tasks] + [self.now])
