"""The device plans checked where they can be on a CPU: every measure_gpu
step's deadline leaves room for a chunk and ends inside its step's time
limit, and the default call's limits fit in one device call."""
import os
import re

import pytest

from lab import measure_gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _steps(plan):
  text = open(os.path.join(ROOT, "lab", plan)).read().replace("\\\n", " ")
  default = re.search(r'STEPS="\$\{\*:-([^}]*)\}"', text).group(1).split()
  steps = {m.group(1): (int(m.group(2)), m.group(3))
           for m in re.finditer(r"^step (\S+) (\d+) (.*)$", text, re.M)}
  return default, steps


def test_the_timing_plan_s_deadlines_fit_their_limits_and_one_call():
  default, steps = _steps("timing_plan.sh")
  assert set(default) <= set(steps)
  assert sum(steps[s][0] for s in default) <= 560  # (a call runs at most 600 s)
  for name, (limit, command) in steps.items():
    for d in re.findall(r"--deadline (\d+)", command):
      assert measure_gpu.CHUNK_RESERVE_S + 20 <= int(d) <= limit - 5, (name, d, limit)


def test_a_deadline_that_leaves_no_chunk_room_is_refused(capsys):
  with pytest.raises(SystemExit) as e:
    measure_gpu.main(["--only-micros", "--filter", "l2_half", "--deadline", "35"])
  assert e.value.code == 2
  assert "a chunk starts only with 40 s left" in capsys.readouterr().err


# Seconds a case took on the H200 in the call of 2026-12-05
# (../shared/h200/2026-12-05: the plan's summaries), and what a step spends
# before its first case (imports, the device's start).
_DEVICE_S = {"fp8": 7.5,         # (fp8k: two traced fp8 cases in 15 s)
             "l2half": 1.0,      # (l2: 24 l2_lag streams in 11 s)
             # (the attention trace's 65 us a range written out: 512 blocks of
             # two consumers' 128 ranges, and the kernel's build and warm-up)
             "wstrace": 15.0,
             # (a rowstrace case's 14 s, kept as a wide margin: the rows step's
             # plain micros took about half a second each)
             "copyown": 14.0,
             "smemrw": 1.0,      # (rows: 12 micros, two timings each, in 7 s)
             "blind5": 1.9}      # (blind3: 14 rows in 26 s)
_START_S = 20.0


def _device_cases(step):
  from lab import calibrate, pipeline_trace, timing_suite, ws_trace
  if step == "fp8":
    return len(pipeline_trace.FP8_CASES)
  if step == "wstrace":
    return len(ws_trace.CASES)
  if step in ("l2half", "copyown", "smemrw"):
    key = {"l2half": "l2_half", "copyown": "_own_", "smemrw": "smem_rw_"}[step]
    return len([m for m in calibrate.MICROS if key in m.name])
  return len([c for c in timing_suite.cases("families") if "(blind 5)" in c.name])


def test_each_step_of_the_next_call_fits_its_limit_at_the_device_s_speed():
  """The default call's steps, case by case at the speed the H200 showed,
  end inside their limits (and a measure_gpu step's inside its deadline),
  with room for a slower day: a step stopped at its limit loses cases."""
  default, steps = _steps("timing_plan.sh")
  assert set(_DEVICE_S) == set(default)
  for name in default:
    limit, command = steps[name]
    need = _START_S + _device_cases(name) * _DEVICE_S[name]
    deadline = re.findall(r"--deadline (\d+)", command)
    budget = int(deadline[0]) if deadline else limit
    assert 1.25 * need <= budget, (name, need, budget)


def test_the_library_plan_s_default_fits_one_call():
  default, steps = _steps("library_plan.sh")
  assert default and set(default) <= set(steps)
  assert sum(steps[s][0] for s in default) <= 560
