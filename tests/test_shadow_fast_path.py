"""Race checking's common case (races.Tracker.access: nothing unordered, one
read slot) runs in one numba call; everything else in numpy. The property:
on random sequences of reads and writes over random views of one buffer,
by agents whose vector clocks learn of each other at random, the fast path
leaves every shadow entry and every race report as the numpy path alone
does."""
import types

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pallas_sim.backends.sim.checks import races
from pallas_sim.backends.sim.base.events import RaceFound


def tracker():
  tr = races.Tracker(log=None)
  tr.start_group([])
  tr.thread_comps = np.array([1, 2, 3])
  return tr


def buffer(shape):
  data = np.zeros(shape, np.float16)
  return types.SimpleNamespace(data=data, shadow=None, alloc_key=None, space="smem",
                               packed=None, lent=False, name="x",
                               address=lambda: data.ctypes.data)


VIEWS = [lambda d: d, lambda d: d[1:3], lambda d: d[:, ::2], lambda d: d[2:, 1:5],
         lambda d: d[::-1], lambda d: d[3, 2:3], lambda d: d[:, 3],
         lambda d: np.broadcast_to(d[0, :1], (3,))]


def run(ops, fast):
  tr, buf = tracker(), buffer((6, 8))
  vecs = {a: np.full(4, 0, np.int64) for a in (1, 2, 3)}
  for v in vecs.values():
    v[0] = 1 << 60
  sites = {}
  for agent, write, view, learn in ops:
    vec = vecs[agent]
    if learn:  # (agent learns what `learn` knew: a synchronization)
      np.maximum(vec, vecs[learn], out=vec)
    vec[agent] += 1
    site = sites.setdefault((agent, write), races.Site(
        len(sites), "thread", "prim", f"k.py:{len(sites)}", "x",
        "write" if write else "read", agent))
    a = types.SimpleNamespace(thread=agent, pos=agent - 1)
    if not fast:
      races.plain_access = lambda *args: False
    try:
      tr.access(buf, VIEWS[view](buf.data), vec, agent, int(vec[agent]), site, write, a,
                types.SimpleNamespace(index=(0,)))
    finally:
      races.plain_access = PLAIN
  sh = buf.shadow
  arrays = {k: v.copy() for k, v in vars(sh).items() if isinstance(v, np.ndarray)}
  events = [(e.kind, e.first.id, e.second.id, e.elements) for e in tr.events]
  return arrays, events, sh.read_slots


PLAIN = races.plain_access


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.booleans(), st.integers(0, len(VIEWS) - 1),
                          st.sampled_from([None, None, 1, 2, 3])), min_size=1, max_size=25))
def test_the_fast_path_leaves_what_the_numpy_path_leaves(ops):
  ops = [(a, w, v, None if l == a else l) for a, w, v, l in ops]
  fast, slow = run(ops, True), run(ops, False)
  assert fast[1] == slow[1] and fast[2] == slow[2]
  assert fast[0].keys() == slow[0].keys()
  for k in fast[0]:
    np.testing.assert_array_equal(fast[0][k], slow[0][k], err_msg=k)


def test_rows_of_views():
  assert races.rows_of((128, 64), (64, 1)) == (1, 8192, 0, 1)   # a whole tile: one row
  assert races.rows_of((128, 64), (1024, 1)) == (128, 64, 1024, 1)
  assert races.rows_of((1, 1), (64, 1)) == (1, 1, 0, 1)
  assert races.rows_of((64,), (2,)) == (1, 64, 0, 2)
  assert races.rows_of((2, 3, 4), (100, 10, 1)) is None           # three loops
  assert races.rows_of((4,), (0,)) is None and races.rows_of((4,), (-1,)) is None


def run_groups(groups, release_bytes, monkeypatch):
  """Groups of (agent, write, view, learn) accesses to one GMEM buffer, each
  group's clocks above the last's: the race reports of each group."""
  tr, buf = races.Tracker(log=None, release_bytes=release_bytes), buffer((6, 8))
  buf.space = "gmem"
  sites, reports, base = {}, [], 0
  for number, ops in enumerate(groups, 1):
    events = []
    tr.start_group(events)
    tr.thread_comps = np.array([1, 2, 3])
    vecs = {a: np.full(4, base, np.int64) for a in (1, 2, 3)}
    for v in vecs.values():
      v[0] = 1 << 60
    for agent, write, view, learn in ops:
      vec = vecs[agent]
      if learn and learn != agent:
        np.maximum(vec, vecs[learn], out=vec)
      vec[agent] += 1
      site = sites.setdefault((agent, write), races.Site(
          len(sites), "thread", "prim", f"k.py:{len(sites)}", "x",
          "write" if write else "read", agent))
      tr.access(buf, VIEWS[view](buf.data), vec, agent, int(vec[agent]), site, write,
                types.SimpleNamespace(thread=agent, pos=agent - 1),
                types.SimpleNamespace(index=(number,),
                                      group=types.SimpleNamespace(number=number)))
    base += 1000
    tr.end_group(base)
    reports.append([(e.kind, e.first.id, e.second.id, e.elements) for e in events
                    if isinstance(e, RaceFound)])
  return reports


OPS = st.lists(st.tuples(st.integers(1, 3), st.booleans(), st.integers(0, len(VIEWS) - 1),
                         st.sampled_from([None, None, 1, 2, 3])), max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(OPS, min_size=1, max_size=4))
def test_gmem_reports_are_the_same_whether_shadows_are_released_each_group_or_never(
    groups):
  """A GMEM shadow's entries of earlier groups are ordered before every
  later access, so giving its pages back (zeros, its reads logged again
  until the next write) or keeping them changes no report."""
  with pytest.MonkeyPatch.context() as mp:
    every = run_groups(groups, 0, mp)
    never = run_groups(groups, 1 << 40, mp)
  assert every == never


def test_a_write_races_with_every_unordered_read_logged_before_it(monkeypatch):
  """GMEM reads before a buffer's first write are logged (inputs are rarely
  written); at that write they all count: thread 2's read as well as
  thread 1's own (the log once kept only the last read of an element)."""
  reads_then_write = [(2, False, 0, None), (1, False, 0, None), (1, True, 0, None)]
  for release_bytes in (0, 1 << 40):
    [first, second] = run_groups([[(1, True, 0, None)], reads_then_write],
                                 release_bytes, monkeypatch)
    assert first == []
    # (site 1: thread 2's read; site 0: thread 1's write)
    assert [(kind, a, b) for kind, a, b, _ in second] == [("read-write race", 1, 0)]


def test_a_shadow_keeps_summaries_of_a_few_views_only():
  """Each block of a launch writes its own rows of an output: its shadow
  must not keep a summary per block (each stamp would scan them all)."""
  tr, buf = tracker(), buffer((512, 8))
  vec = np.full(4, 0, np.int64)
  vec[0] = 1 << 60
  site = races.Site(0, "thread", "prim", "k.py:1", "x", "write", 1)
  agent = types.SimpleNamespace(thread=1, pos=0)
  for row in range(512):
    vec[1] += 1
    tr.access(buf, buf.data[row], vec, 1, int(vec[1]), site, True, agent,
              types.SimpleNamespace(index=(0,)))
  assert 0 < len(buf.shadow.known_w) <= races.KNOWN_MAX
  assert (buf.shadow.wk.reshape(512, 8) == np.arange(1, 513)[:, None]).all()
