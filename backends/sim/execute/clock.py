"""A launch's SM clock and power (timing/power.py): where the clock was not
asked for and the power at the boost clock passes the board's limit, the
launch is timed again at lower clocks, as ps.estimate times it (one block
per class, no checks), and takes the times of the last."""
from pallas_sim.backends.sim.timing import bound, power


def settle(executor, launch, arrays):
  """Sets the power and clock of the launch's kernel report (the last in
  executor.report), timing it again at lower clocks where its power asks."""
  k = executor.report.kernels[-1]
  g = executor.gpu
  opts = executor.options
  w = power.work(k)
  k.power_w = power.watts(g, k.sm_mhz, k.time_s, *w)
  k.clock_note = bound.clock_note(g, k.sm_mhz, opts.clock_mhz, k.power_w)
  if opts.clock_mhz is not None or k.power_w <= g.power_limit_w:
    return
  samples = [(k.sm_mhz, k.time_s)]
  mhz = power.first_guess(g, k.time_s, w)
  r = _timed_at(executor, launch, arrays, mhz)
  for _ in range(executor.tuning.clock_rounds):
    samples.append((mhz, r.time_s))
    nxt = power.next_guess(g, samples, power.work(r))
    if abs(nxt - mhz) < g.clock_step_mhz:
      break
    mhz = nxt
    r = _timed_at(executor, launch, arrays, mhz)
  r.power_w = power.watts(g, r.sm_mhz, r.time_s, *power.work(r))
  r.clock_note = bound.clock_note(g, r.sm_mhz, None, r.power_w, k.power_w)
  r.wall_s += k.wall_s
  r.workers, r.simulated_blocks, r.classes = k.workers, k.simulated_blocks, k.classes
  executor.report.kernels[-1] = r


def _timed_at(executor, launch, arrays, mhz):
  """The launch's kernel report at `mhz`, timed as ps.estimate times it."""
  ex = executor.estimated(launch, arrays, clock_mhz=mhz)
  if ex.errors:
    raise ex.errors[0]
  return ex.report.kernels[-1]
