"""Hardware named barriers: `bar.sync id, n` and `bar.arrive id, n` (PTX
`barrier.cta`), as inline_mgpu bodies emit them (inline PTX, nvvm.barrier,
nvvm.barrier.arrive, gpu.barrier).

A block has 16. A barrier counts arriving CUDA threads: a body run by a
warpgroup arrives with its 128 lanes, one run by a warp inside warp_map with
32. The first arrival of a phase sets its thread count; the phase completes
when that many have arrived, and releases the threads that sync on it. A
sync waits for the phase its own arrival joined: unlike an mbarrier, nothing
goes by phase parity. For happens-before (checks/observer.py) an arrival
releases what its thread did before it, and a sync also acquires what every
arrival of its phase released.

Misuse is raised at the user's line: an id past 15; a count that is not a
multiple of the warp size, or more than the block's threads; arrivals of one
phase with different counts; an arrival of more threads than the phase
lacks (the hardware would split its warps between two phases); ids
0..num_threads with any other use than the Mosaic GPU lowering's own (0: the
block-wide barrier; 1+i: warpgroup i's barrier, which commit_smem and
warp_map use). An arrival that nothing orders after every arrival of the
phase before it is a finding with both lines (race checking on): on the
hardware it can come first and fill that phase. A sync that never completes
is a deadlock, named with the barrier's state. Phases that bar.arrive alone
leaves incomplete when the block ends are not reported: the hardware resets
named barriers when a block starts, and pipelines that pre-arrive on
release barriers end that way.
"""
from pallas_sim.backends.sim.machine.scheduler import Resource, Wait
from pallas_sim.errors import KernelError

COUNT = 16  # named barriers a block has (bar.sync's ids 0..15)
WARP = 32


class NamedBarrier(Resource):
  """One named barrier of a block: the pending phase's count (None before its
  first arrival), threads arrived and who they were; completed phases and
  when each completed. `key`/`hb`/`block`: what the happens-before observer
  keys its clock by, as for an mbarrier."""
  __slots__ = ("block", "id", "key", "count", "arrived", "by", "latest",
               "completions", "completed_at", "hb", "repeats")
  kind = "named"

  def __init__(self, block, bid):
    super().__init__(f"named barrier {bid}")
    self.block = block
    self.id = bid
    self.key = ("named", bid)
    self.count = None
    self.arrived = 0
    self.by = []  # (thread name, threads, where) of the pending phase
    self.latest = 0.0  # the latest clock among its arrivals
    self.completions = 0
    self.completed_at = []
    self.hb = None
    self.repeats = []  # (phase, thread) where a thread arrived more than once

  def state(self):
    """The pending phase, in words (deadlock reports)."""
    phase = self.completions + 1
    if self.count is None:
      text = f"phase #{phase}: no thread arrived"
    else:
      who = ", ".join(f"{name} ({n} at {where})" for name, n, where in self.by)
      text = f"phase #{phase}: {self.arrived} of {self.count} threads arrived: {who}"
    if self.repeats:
      text += ("; phases that one thread's arrivals filled more than once: "
               + ", ".join(f"#{k} ({name})" for k, name in self.repeats[:3]))
    return text


def barrier(block, bid):
  nb = block.named.get(bid)
  if nb is None:
    nb = block.named[bid] = NamedBarrier(block, bid)
  return nb


def _threads(wg):
  return WARP if hasattr(wg, "parent") else 128


def _owner(wg):
  """The warpgroup a thread (or a warp of warp_map) belongs to."""
  return getattr(wg, "parent", wg)


def _check(wg, op, bid, count):
  """The barrier id and thread count, checked as the hardware and the
  lowering constrain them; returns the count (None: the whole block)."""
  blk = wg.block
  nwg = len(blk.warpgroups)
  block_threads = 128 * nwg
  if not 0 <= bid < COUNT:
    raise KernelError(f"{op} {bid}: a block has named barriers 0..{COUNT - 1}")
  if count is None:
    count = block_threads
  if count <= 0 or count % WARP:
    raise KernelError(f"{op} {bid}, {count}: the thread count must be a positive "
                      f"multiple of the warp size ({WARP})")
  if count > block_threads:
    raise KernelError(f"{op} {bid}, {count}: the block has {block_threads} threads "
                      f"({nwg} warpgroups), so the barrier could never complete")
  if bid == 0 and count != block_threads:
    raise KernelError(
        f"{op} 0, {count}: barrier 0 is the block-wide barrier (gpu.barrier, "
        f"bar.sync 0) over all {block_threads} threads; use ids "
        f"{nwg + 1}..{COUNT - 1} for barriers of your own")
  if 1 <= bid <= nwg and (count != 128 or _owner(wg).index != bid - 1):
    raise KernelError(
        f"{op} {bid}, {count} by thread {wg.index}: the Mosaic GPU lowering uses "
        f"named barrier {bid} for warpgroup {bid - 1}'s own barrier (commit_smem, "
        f"warp_map), over its 128 threads; ids 0..{nwg} are the lowering's in a "
        f"kernel of {nwg} warpgroups: use {nwg + 1}..{COUNT - 1}")
  return count


def _arrive(wg, nb, op, count, where):
  """One arrival of `wg`'s threads; returns the phase it joined."""
  n = _threads(wg)
  if nb.count is None:
    nb.count = count
  elif nb.count != count:
    raise KernelError(
        f"{op} {nb.id}, {count} by thread {wg.index}: phase #{nb.completions + 1} of "
        f"{nb.name} began with a count of {nb.count} "
        f"({nb.by[0][0]} at {nb.by[0][2]}); every arrival of a phase must give "
        "the same count")
  if nb.arrived + n > nb.count:
    raise KernelError(
        f"{op} {nb.id}, {count} by thread {wg.index}: {n} more threads where phase "
        f"#{nb.completions + 1} lacks {nb.count - nb.arrived} ({nb.state()}): the "
        "hardware would complete the phase with some of its warps and count the "
        "rest towards the next; the count must add up to the threads that "
        "arrive in each phase")
  blk = wg.block
  blk.hb.named_arrive(wg, nb, where)
  nb.arrived += n
  nb.by.append((f"thread {wg.index}", n, where))
  # (a thread runs ahead until it blocks: the phase completes at its
  # latest arrival's clock, not at the one that happened to come last)
  nb.latest = max(nb.latest, wg.time)
  phase = nb.completions + 1
  if nb.arrived == nb.count:
    names = [name for name, _, _ in nb.by]
    nb.repeats += [(phase, name) for name in dict.fromkeys(names) if names.count(name) > 1]
    nb.completions += 1
    nb.completed_at.append(nb.latest)
    blk.hb.phase_completed(nb)
    blk.sched.notify(nb, at=nb.latest)
    nb.count, nb.arrived, nb.by, nb.latest = None, 0, [], 0.0
  return phase


def arrive(wg, bid, count, where):
  """bar.arrive: counts this thread's arrival and goes on."""
  op = "bar.arrive"
  count = _check(wg, op, bid, count)
  _arrive(wg, barrier(wg.block, bid), op, count, where)


def sync(wg, bid, count, where, latency):
  """bar.sync (generator): arrives, then waits for the phase it joined."""
  op = "bar.sync"
  count = _check(wg, op, bid, count)
  nb = barrier(wg.block, bid)
  phase = _arrive(wg, nb, op, count, where)
  start = wg.time
  if nb.completions < phase:
    yield Wait(lambda: nb.completions >= phase, (nb,),
               lambda: f"{op} on {nb.name} ({nb.state()})", where)
  done = nb.completed_at[phase - 1]
  if done > wg.time:
    wg.time = done
  if wg.time > start:
    wg.block.event(wg.name, f"bar.sync {bid}", start, wg.time)
    wg.stalled("barrier", start)
  wg.block.hb.waited(wg, nb, phase, where)
  wg.time += latency
