"""The SM clock the board's power limit sets (the model's default clock).

An H100/H200 runs its SMs at 1980 MHz until the board's power reaches its
limit (700 W), then lowers the clock (and the voltage with it) until it is
back within it: the large matmuls of lab/timing_suite.py ran at
1035-1905 MHz, an elementwise kernel at 1980. The power is a fitted function
of what the kernel keeps busy (gpus.GPU.power_*: lab/power_model.py):

    P = P0 + s(f) * (e_tc * tensor FLOP/s + e_l2 * L2 bytes/s) + e_hbm * HBM bytes/s,
    s(f) = (1 - beta * (1 - f / boost))^2

The rates are the kernel's work over its time at f, which the timing model
gives (a simulation at f). So the clock is found by simulating the launch at
the boost clock, and where that draws more than the limit, again at clocks
below it (execute/executor.py): the first at the clock the power would allow if the
time did not change with the clock (the lowest the answer can be, as a
kernel's time only grows as its clock falls), the next where the model's time,
taken as a + b / f through the two clocks simulated, brings the power to the
limit. That clock, on the H200's 15 MHz steps, is the kernel's."""
import numpy as np

# The lowest clock the search goes to (MHz): under it the model is not
# calibrated (the lowest measured, 1035 MHz, is well above).
FLOOR_MHZ = 600.0


def work(kernel):
  """What draws power, from a kernel report: (tensor FLOP, f16-equivalent:
  an fp8 or int8 FLOP counts half, as the tensor cores do twice as many for
  the same power; bytes through the L2; bytes to and from HBM)."""
  l2 = max(kernel.tma_load_bytes + kernel.tma_store_bytes, kernel.hbm_bytes)
  return kernel.tensor_f16_flops, l2, kernel.hbm_bytes


def watts(gpu, mhz, seconds, flops, l2_bytes, hbm_bytes):
  """The board's power at `mhz` for that work done in `seconds`."""
  if seconds <= 0:
    return gpu.power_base_w
  s = (1 - gpu.power_voltage_beta * (1 - mhz / gpu.boost_mhz)) ** 2
  return (gpu.power_base_w
          + s * (gpu.power_w_per_pflops * flops / seconds / 1e15
                 + gpu.power_l2_w_per_10tbs * l2_bytes / seconds / 1e13)
          + gpu.power_hbm_w_per_10tbs * hbm_bytes / seconds / 1e13)


def _highest(gpu, ok, lo=FLOOR_MHZ):
  """The highest clock on the GPU's steps at which ok(mhz) holds (ok falls
  from true to false as the clock rises), lo if none."""
  step = gpu.clock_step_mhz
  top = gpu.boost_mhz
  if ok(top):
    return top
  a, b = lo, top  # ok(a) assumed, not ok(b)
  for _ in range(40):
    m = (a + b) / 2
    a, b = (m, b) if ok(m) else (a, m)
  return max(lo, float(np.floor(a / step) * step))


def first_guess(gpu, seconds, w):
  """The clock the power allows if the kernel took `seconds` at any clock."""
  return _highest(gpu, lambda f: watts(gpu, f, seconds, *w) <= gpu.power_limit_w)


def time_through(samples):
  """The time at any clock f, a + b / f through the last two simulated (mhz,
  seconds) samples (the SMs' work scales as 1/f, the memory system's not)."""
  (f1, t1), (f2, t2) = samples[-2:]
  b = (t1 - t2) / (1 / f1 - 1 / f2) if f1 != f2 else 0.0
  a = t1 - b / f1
  return lambda f: a + b / f


def next_guess(gpu, samples, w):
  """The clock at which the time through two simulated samples
  (time_through) brings the power to the limit."""
  t = time_through(samples)
  return _highest(gpu, lambda f: watts(gpu, f, max(t(f), 1e-12), *w) <= gpu.power_limit_w)
