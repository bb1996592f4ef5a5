"""What limits a kernel, in words, from the timing model's tallies: the
utilisation of each unit over the predicted time, and where the warpgroups'
time went. Read by the report (backends/sim/report/__init__.py); it changes no
prediction."""

# Thresholds for naming a bound (fractions). A unit busy this much of the
# kernel's time is what it waits for; below, the largest stall names it.
BUSY = 0.6
# HBM busy this much of the time binds a kernel whose blocks take longer than
# the HBM floor: they wait on their share of it (timing.Timing.tma).
HBM_BUSY = 0.8
LAUNCH = 0.5
TAIL = 0.25
SPILL = 0.25


def utilisation(kt, totals, gpu):
  """Fractions of the kernel's predicted time each unit was busy, over the
  whole chip: tensor cores, TMA engines, HBM (the time its reads and writes
  take at their rates, kt.memory_s)."""
  chip = gpu.num_sms * kt.seconds * gpu.clock_hz
  if not chip:
    return {"tensor core": 0.0, "TMA": 0.0, "HBM": 0.0}
  return {"tensor core": totals.tensor_cycles / chip,
          "TMA": totals.tma_cycles / chip,
          "HBM": kt.memory_s / kt.seconds}


def clock_note(gpu, mhz, asked, watts, boost_watts=None):
  """Where the SMs' clock, `mhz`, came from: asked for (Options.clock_mhz),
  or the power limit's (timing/power.py): the boost clock when the kernel's
  power stays within the limit there, else the clock that brings it down to
  it."""
  if asked is not None:
    return f"SMs at {mhz:g} MHz throughout (clock_mhz)"
  if boost_watts is None:
    return (f"SMs at the {mhz:g} MHz boost clock: ~{watts:.0f} W, within the "
            f"{gpu.power_limit_w} W limit")
  return (f"SMs at {mhz:g} MHz, the {gpu.power_limit_w} W limit's clock (~{boost_watts:.0f} W "
          f"at the {gpu.boost_mhz:g} MHz boost clock; predicted, timing/power.py: pass "
          f"clock_mhz=, the clock nvidia-smi shows while it runs, to predict at that)")


def stall_shares(totals):
  """Of the warpgroups' time, the share stalled on each kind of wait
  (machine/state.STALLS), and the rest (issuing: "issue")."""
  t = totals.thread_cycles
  if not t:
    return {}
  out = {k: v / t for k, v in totals.stalls.items()}
  out["issue"] = max(0.0, 1.0 - sum(out.values()))
  return out


def busy_in_use(kt, totals, gpu, in_use):
  """Fractions of the SMs' time (those that ran blocks, `in_use`, over the
  time their blocks took, launch overhead aside) that their tensor cores and
  TMA engines were busy: a grid that leaves SMs idle keeps the ones it uses
  as busy as a full one would."""
  cycles = min(in_use, gpu.num_sms) * kt.compute_s * gpu.clock_hz
  if not cycles:
    return {"tensor core": 0.0, "TMA": 0.0}
  return {"tensor core": totals.tensor_cycles / cycles, "TMA": totals.tma_cycles / cycles}


def name(kt, totals, util, regs, busy=None, idle_sms=False):
  """The bound, in words, with its reason. `busy`: busy_in_use's shares
  (default: util's, over the whole chip); `idle_sms`: the grid left SMs
  idle (the reason then says the shares are of the SMs in use)."""
  if kt.launch_s >= LAUNCH * kt.seconds:
    return "launch overhead", f"{kt.launch_s * 1e6:.1f} us of launch in {kt.seconds * 1e6:.1f} us"
  if kt.memory_s >= kt.compute_s:
    return "HBM", f"{util['HBM']:.0%} of HBM bandwidth"
  if util["HBM"] >= HBM_BUSY:
    alu = stall_shares(totals).get("issue", 0.0) >= 0.5
    return "HBM", (f"{util['HBM']:.0%} of HBM bandwidth" + (
        ", beside ALU work its blocks' pipelines overlap with it only in part" if alu
        else ": its blocks wait on their share of it"))
  if kt.tail_s >= TAIL * kt.compute_s:
    return "tail wave", (f"the last wave is {kt.last_wave_fill:.0%} full and takes "
                         f"{kt.tail_s / kt.compute_s:.0%} of the time")
  t = totals.thread_cycles
  if regs is not None and regs.spilled and t and totals.stalls["spill"] >= SPILL * t:
    return "register spills", (f"{regs.spilled} registers per lane spill "
                               f"({regs.per_thread} needed, {regs.limit} allowed)")
  # (the busier of the two, where both are; a TMA engine saturated is what
  # its SM's share of L2/HBM bandwidth lets through)
  busy = busy or util
  unit = max(("tensor core", "TMA"), key=lambda u: busy[u])
  if busy[unit] >= BUSY:
    where = " of the time on the SMs in use" if idle_sms else ""
    if unit == "TMA":
      return "TMA bandwidth", f"TMA engines busy {busy['TMA']:.0%}{where}"
    return "tensor core", f"tensor cores busy {busy['tensor core']:.0%}{where}"
  shares = stall_shares(totals)
  if not shares:
    return "launch overhead", "no work"
  kind = max(shares, key=shares.get)
  words = {"TMA": "TMA latency", "TMA store": "TMA latency", "barrier": "barrier stalls",
           "tensor core": "tensor core", "spill": "register spills",
           "GMEM load": "GMEM load latency", "issue": "ALU"}[kind]
  return words, f"warpgroups {'issue' if kind == 'issue' else 'wait on ' + kind} {shares[kind]:.0%} of their time"
