"""Which signals a semaphore wait is ordered after.

A semaphore is a counter: a signal adds to it (and releases what its thread
did before it); a wait for n spins until it holds at least n (then takes n
away when it decrements); a read returns it. On the hardware a wait is
ordered after *some* signals that add up to what it needs, not after
particular ones, so it acquires a signal only when it could not have
completed without it: when the other signals that can come before it
(those not ordered after it), less what the waits ordered before it took
away, add up to less than it needs. A read that returned n is taken as a
wait for n that takes nothing away.

That depends on signals the simulation may make only after the wait, and on
the order the waits themselves make. A launch with semaphores therefore runs
first acquiring every signal made before each wait (more than the hardware
promises); where a wait then needed fewer (`needed`), it runs again with each
wait acquiring exactly those (execute/executor.py). Fewer acquisitions order
less, so the signals a wait needs only shrink from run to run; the runs stop
when they no longer change.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
  from pallas_sim.backends.sim.checks.observer import _WgClock


class Signal:
  """One signal: its key (thread component, how many signals that thread
  made before it), the thread (observer._WgClock), its clock then, where,
  by how much, what it releases (vc, avc), how many signals came before it;
  `sync`: all the thread knew, which is more than vc under
  unsafe_no_auto_barriers (one lane signals: it releases of the thread's
  accesses only what every lane had ordered, yet comes after all the thread
  observed, so which waits it follows and which barrier phases are ordered
  before it are told by `sync`)."""
  __slots__ = ("key", "who", "thread", "clock", "where", "inc", "vc", "avc", "order",
               "named", "sync")
  key: tuple[int, int]
  who: _WgClock
  thread: int
  clock: int
  where: str | None
  inc: int
  vc: np.ndarray
  avc: np.ndarray
  order: int
  named: Before               # (set when a report first names it: _before_of)
  sync: np.ndarray


class Acquire:
  """One wait or read: its key (thread component, how many acquires that
  thread made before it), the thread, its clock after the acquire, what it
  knew then (vc), what it needed (want), whether it took that away
  (decrement), where, the signals it acquired (keys), how many signals were
  made before it, and what an earlier run found it needs (Need, or None);
  `sync`: all it knew then (Signal.sync)."""
  __slots__ = ("key", "who", "thread", "clock", "vc", "want", "decrement", "where",
               "got", "order", "read", "need", "sync")
  key: tuple[int, int]
  who: _WgClock
  thread: int
  clock: int
  vc: np.ndarray
  want: int
  decrement: bool
  where: str | None
  got: frozenset[tuple[int, int]] | _SoFar
  order: int
  read: bool
  need: Need | None
  sync: np.ndarray


class Before(NamedTuple):
  """A signal that can come before a wait, as reports name it."""
  key: tuple
  thread: int
  clock: int
  where: str
  inc: int
  who: str


class Need(NamedTuple):
  """What a run found an acquire needs: the signals it is ordered after
  (keys); and for reports in the next run, where some of the signals that
  can come before it come only after it: what those add up to (total), where
  the waiting thread's own first one is (own, or None), and each signalling
  thread's latest one (latest: thread component -> Before). A thread's
  latest is the one that covers most of what it did (a persistent loop's
  thousands of waits keep a few entries each, not every signal)."""
  keys: frozenset
  total: int
  own: object
  latest: dict


class SemLog:
  """One semaphore of a group (an element of a semaphore array): its value
  at the launch's start, its signals and acquires in simulated order, keys
  to signals, and the join of every signal so far (what a wait acquires
  before the order is known: acc, and sync's join)."""
  __slots__ = ("name", "start", "signals", "acquires", "by_key", "acc", "sync")

  def __init__(self, name, start):
    self.name, self.start = name, int(start)
    self.signals: list[Signal] = []
    self.acquires: list[Acquire] = []
    self.by_key: dict[tuple[int, int], Signal] = {}
    # (vc, avc): what every signal so far released
    self.acc: tuple[np.ndarray, np.ndarray] | None = None
    self.sync: np.ndarray | None = None


class _Table:
  """A SemLog's signals and acquires as arrays, so that what each acquire
  needs is a few vector operations (a persistent loop may wait thousands of
  times on one semaphore)."""

  def __init__(self, log):
    sig, acq = log.signals, log.acquires
    # (no signal: a read of one nothing signals, a wait on what the launch began with)
    # (what each signal follows: all its thread knew, not only what it released)
    self.vc = np.array([s.sync for s in sig]) if sig else np.zeros((0, 0), np.int64)
    self.thread = np.array([s.thread for s in sig], np.int64)
    self.clock = np.array([s.clock for s in sig], np.int64)
    self.inc = np.array([s.inc for s in sig], np.int64)
    self.order = np.array([s.order for s in sig], np.int64)
    self.a_thread = np.array([o.thread for o in acq], np.int64)
    self.a_clock = np.array([o.clock for o in acq], np.int64)
    self.a_take = np.array([o.want if o.decrement else 0 for o in acq], np.int64)


def needed(log, w, table=None):
  """What acquire `w` needs (Need) under the order the run made."""
  t = table or _Table(log)
  before = t.vc[:, w.thread] < w.clock if len(t.inc) else np.zeros(0, bool)
  ordered = w.sync[t.thread] >= t.clock  # (signals ordered before the wait)
  taken = w.sync[t.a_thread] >= t.a_clock  # (acquires ordered before it: itself too)
  avail = (log.start + int(t.inc[before & (t.inc > 0)].sum())
           + int(t.inc[ordered & (t.inc < 0)].sum())
           - int(t.a_take[taken].sum()) + (w.want if w.decrement else 0))
  maybe = before & (t.inc > 0)
  sig = log.signals
  keys = frozenset(sig[i].key for i in np.flatnonzero(
      maybe & (t.order < w.order) & (avail - t.inc < w.want)))
  idx = np.flatnonzero(maybe)
  own = idx[t.thread[idx] == w.thread]
  return _need(keys, [sig[i] for i in _latest(t.thread[idx], idx)], int(t.inc[idx].sum()),
               sig[own[0]] if len(own) else None)


def _latest(threads, idx):
  """Of the indices `idx` (ascending), each thread's last (`threads`: theirs)."""
  if not len(idx):
    return []
  _, pos = np.unique(threads[::-1], return_index=True)
  return idx[len(idx) - 1 - pos]


def _before_of(s):
  """Signal `s` as reports name it (made once: many waits name it)."""
  b = getattr(s, "named", None)
  if b is None:
    b = s.named = Before(s.key, s.thread, s.clock, s.where, s.inc, s.who.who)
  return b


def _need(keys, latest, total, own):
  return Need(keys, total, None if own is None else _before_of(own),
              {s.thread: _before_of(s) for s in latest})


def needs(logs):
  """{acquire key: Need} for every acquire of `logs`, where one of them
  acquired signals other than those it needs; {} when none did."""
  out = {}
  changed = False
  for log in logs:
    table = _Table(log)
    for w in log.acquires:
      n = out[w.key] = needed(log, w, table)
      changed |= not _same(n.keys, w.got)
  return out if changed else {}


class _SoFar:
  """The keys of a log's first `n` signals (what a wait acquires when the
  order is not known yet), without a set of them a wait."""
  __slots__ = ("log", "n")

  def __init__(self, log, n):
    self.log, self.n = log, n

  def __contains__(self, key):
    s = self.log.by_key.get(key)
    return s is not None and s.order < self.n

  def __len__(self):
    return self.n

  def __iter__(self):
    return (s.key for s in self.log.signals[:self.n])


def _same(keys, got):
  """Whether the keys a wait needs are those it acquired (`got`: keys, or
  _SoFar: every signal before it, of which `keys` are a subset)."""
  return len(keys) == len(got) if isinstance(got, _SoFar) else keys == got


def join(log, need, vc, avc, sync=None):
  """Joins into (vc, avc) what the signals `need.keys` released (every
  signal so far when need is None), and into `sync` (None: not kept) all
  their threads knew: the keys joined."""
  if need is None:
    if log.acc is not None:
      np.maximum(vc, log.acc[0], out=vc)
      np.maximum(avc, log.acc[1], out=avc)
      if sync is not None:
        np.maximum(sync, log.sync, out=sync)
    return _SoFar(log, len(log.signals))
  for k in need.keys:
    s = log.by_key[k]
    np.maximum(vc, s.vc, out=vc)
    np.maximum(avc, s.avc, out=avc)
    if sync is not None:
      np.maximum(sync, s.sync, out=sync)
  return need.keys


def why_not(log, w, thread, clock):
  """Words for a race through the gap, or None: a signal by `thread` at or
  after its `clock` (after the access that races) can come before wait `w`,
  but `w` is not ordered after it, since the others are enough."""
  need = w.need or needed(log, w)  # (the first run: the signals made so far)
  s = need.latest.get(thread)
  if s is None or s.clock < clock or s.key in w.got:
    return None
  total, own = need.total, need.own
  head = (f"{w.who.who} waits for {w.want} of the {total} signals that can precede "
          f"it on {log.name} ({w.where})")
  if own is not None:
    reason = f"its own signal ({own.where}) can count towards them"
    fix = f"wait for all {total}, or signal only from the threads it waits for"
  else:
    reason = f"any {w.want} of them complete it"
    fix = f"wait for all {total}"
  return (f"{head}; {reason}, so the wait can complete without {s.who}'s signal "
          f"({s.where}), and a wait is ordered only after the signals it cannot "
          f"complete without: {fix}")
