"""mbarrier semantics: arrivals, expected transaction bytes, phase completion,
and (with race detection) the happens-before each completion carries."""
import numpy as np

from pallas_sim.errors import KernelError


def _maybe_complete(slot, sched):
  if slot.arrivals >= slot.num_arrivals and slot.tx == 0:
    slot.arrivals -= slot.num_arrivals
    slot.completions += 1
    if slot.comp is not None:
      vc, avc = slot.acc
      k = slot.completions
      vc[slot.comp] = avc[slot.comp] = slot.base + k
      slot.phases.append((vc, avc))
      slot.acc = None
      _check_phase(slot, k, vc)
    sched.notify(slot)


def _check_phase(slot, k, vc):
  """Completion k must happen after every waiting thread observed k-1:
  mbarrier waits go by phase parity, so a waiter that has not yet seen k-1
  when k completes can miss a completion (or take one for another)."""
  for tid, (seen, clock, where) in slot.waits.items():
    if seen < k - 1 or vc[tid + 1] < clock:
      slot.misuse(tid, where,
                  f"barrier {slot.name} completed for the {_nth(k)} time before "
                  f"thread {tid} was known to have observed completion #{k - 1}"
                  f" (it has observed {seen}): waits go by phase parity, so on "
                  "hardware a completion can be lost; make the arrivals of the "
                  "next phase wait for the waiter (e.g. a second barrier back)")


def _nth(k):
  return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def arrive(slot, sched, expect_tx=0, vecs=None):
  """One warpgroup-wide arrival, optionally announcing `expect_tx` bytes;
  `vecs` = (vc, avc) of the arriving agent, with race detection."""
  slot.arrivals += 1
  if slot.arrivals > slot.num_arrivals:
    raise KernelError(
        f"barrier {slot.name}: {slot.arrivals} arrivals in one phase, but it "
        f"was created with num_arrivals={slot.num_arrivals} (arrival count "
        "overflow)")
  slot.tx += expect_tx
  if vecs is not None and slot.comp is not None:
    if slot.acc is None:
      slot.acc = (vecs[0].copy(), vecs[1].copy())
    else:
      np.maximum(slot.acc[0], vecs[0], out=slot.acc[0])
      np.maximum(slot.acc[1], vecs[1], out=slot.acc[1])
  _maybe_complete(slot, sched)


def complete_tx(slot, nbytes, sched):
  """An async copy landed `nbytes` on the barrier."""
  slot.tx -= nbytes
  _maybe_complete(slot, sched)
