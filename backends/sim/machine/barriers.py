"""mbarrier semantics: arrivals, expected transaction bytes, phase completion,
and the misuse of waits by phase parity. (What each completion orders is the
happens-before observer's: checks/observer.py.)"""
from pallas_sim.errors import KernelError


def _maybe_complete(slot, at, by_copy=False):
  """`at`: the completing agent's clock (None: the current event's). A
  warpgroup runs ahead until it blocks, so a waiter may look at the barrier
  before, in simulated time, the completion it finds: it resumes at
  `completed_at`, never before. The phase completes at its latest
  arrival's clock, which need not be the arrival the simulation made last
  (one by a warpgroup that ran ahead may have come first)."""
  now = slot.block.sched.now if at is None else at
  slot.latest = max(slot.latest, now)
  if slot.arrivals >= slot.num_arrivals and slot.tx == 0:
    t, slot.latest = slot.latest, 0.0
    slot.arrivals -= slot.num_arrivals
    slot.completions += 1
    slot.completed_at.append(t)
    slot.by_copy.append(by_copy)
    slot.block.hb.phase_completed(slot)
    _check_phase(slot, slot.completions)
    slot.block.sched.notify(slot, t)


def _check_phase(slot, k):
  """Completion k must happen after every waiting warpgroup observed k-1:
  mbarrier waits go by phase parity, so a waiter that has not yet seen k-1
  when k completes can miss a completion (or take one for another). With
  race checking on, "seen" means known by happens-before, not only in the
  simulated order."""
  hb = slot.block.hb
  for wg, (seen, where) in slot.waits.items():
    if seen < k - 1:
      when = (f"while thread {wg.index} had observed only completion #{seen} "
              f"(its last wait: {where})" if seen else
              f"before thread {wg.index}, which waits on it ({where}), observed "
              "its first")
    elif hb.unordered_waiter(slot, wg):
      # Observed in the simulated order, but nothing the waiter did after
      # that wait reached the arrivals that made this completion.
      when = (f"after thread {wg.index} observed completion #{k - 1} ({where}), "
              "but nothing orders that wait before the arrivals that made "
              f"#{k}, so on hardware they can come first")
    else:
      continue
    made = hb.made_by(slot, k)
    lost_completion(
        slot, wg, where,
        f"barrier {slot.name} completed for the {_nth(k)} time"
        + (f" ({made})" if made else "") + f" {when}: waits go by phase parity, "
        "so a completion can be lost; make the arrivals of the next phase wait "
        f"for thread {wg.index} (e.g. a second barrier back)"
        + hb.arrival_count_note(slot))


def lost_completion(slot, wg, where, text):
  site = slot.block.group.log.site("thread", "barrier_wait", where, slot.name, "wait",
                                   wg.index)
  slot.block.group.misuse("lost barrier completion", site, slot.block, text)


def _nth(k):
  return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def phase_state(slot):
  """What a barrier's current phase still waits for, for a wait's deadlock
  report: "; its phase has 1 of its 2 arrivals", and the bytes of TMA
  loads it expects that have not landed."""
  text = (f"; its phase has {slot.arrivals} of its {slot.num_arrivals} "
          f"arrival{'s' if slot.num_arrivals > 1 else ''}")
  if slot.tx > 0:
    text += f", and expects {slot.tx} more bytes of TMA loads"
  return text


def arrive(slot, expect_tx=0, at=None):
  """One warpgroup-wide arrival, optionally announcing `expect_tx` bytes, by
  an agent whose clock reads `at` (its waiters resume no earlier)."""
  slot.arrivals += 1
  if slot.arrivals > slot.num_arrivals:
    raise KernelError(
        f"barrier {slot.name}: {slot.arrivals} arrivals in one phase, but it "
        f"was created with num_arrivals={slot.num_arrivals} (arrival count "
        "overflow)")
  slot.tx += expect_tx
  _maybe_complete(slot, at)


def complete_tx(slot, nbytes):
  """An async copy landed `nbytes` on the barrier (at the current event)."""
  slot.tx -= nbytes
  _maybe_complete(slot, None, by_copy=True)
