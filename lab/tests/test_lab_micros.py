"""The micro-benchmarks the next device call measures, each run in the
simulator (two loop lengths, races checked, the real lowering run on the
kernel) against its reference: a micro that cannot run here would come
back from the device empty or failed."""
import re

from lab import calibrate
from test_lab_plans import _steps


def test_the_next_call_s_micros_run_in_the_simulator(capsys):
  default, steps = _steps("timing_plan.sh")
  patterns = [re.search(r"--filter (\S+)", steps[s][1]).group(1) for s in default
              if "--only-micros" in steps[s][1]]
  assert patterns
  for p in patterns:
    assert any(p in m.name for m in calibrate.MICROS), p
    assert calibrate.sim_check(p), capsys.readouterr().out


def test_the_plain_gmem_load_micros_run_in_the_simulator(capsys):
  assert calibrate.sim_check("plain_load_"), capsys.readouterr().out
  # (at the GPU's sizes: each load a new 128-byte line, the chain one cycle)
  for count, unit in (((256 << 20) // 4, 4), ((256 << 20) // 256, 256)):
    hop = calibrate._gmem_hop(count, unit)
    assert hop % 2 == 1 and (hop * unit) % 128 != 0 or unit >= 128
