"""mbarrier semantics: arrivals, expected transaction bytes, phase completion."""


def _maybe_complete(slot, sched):
  if slot.arrivals >= slot.num_arrivals and slot.tx == 0:
    slot.arrivals -= slot.num_arrivals
    slot.completions += 1
    sched.notify(slot)


def arrive(slot, sched, expect_tx=0):
  """One warpgroup-wide arrival, optionally announcing `expect_tx` bytes."""
  slot.arrivals += 1
  slot.tx += expect_tx
  _maybe_complete(slot, sched)


def complete_tx(slot, nbytes, sched):
  """An async copy landed `nbytes` on the barrier."""
  slot.tx -= nbytes
  _maybe_complete(slot, sched)
