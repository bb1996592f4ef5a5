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


# Seconds a case took on the H200 (../shared/h200/2026-12-05 and the call of
# 2026-12-07, HISTORY.md), and what a step spends before its first case
# (imports, the device's start).
_DEVICE_S = {"gmem": 1.0,        # (2026-12-07: 6 plain-load micros in 5 s)
             "blind6": 2.0,      # (2026-12-07: blind5, matmuls and row kernels, 1.9 s a row)
             "sem": 2.0,         # (2026-12-07: sem_pingpong's two timings in 4 s)
             "blocks": 2.5,      # (blind5's speed, its rows up to 1 ms a call)
             "hbmrows": 4.0,     # (2026-12-05: 24 l2_lag micros in 11 s; these read 512 MiB a call)
             "smemscale": 1.0}   # (2026-12-07: the 8 smem_rw micros in a few s)
_START_S = 20.0


def _device_cases(step):
  from lab import calibrate, timing_suite
  if step in ("gmem", "sem", "hbmrows", "smemscale"):
    key = {"gmem": "plain_load_", "sem": "sem_", "hbmrows": "b_32slots_2_per_sm",
           "smemscale": "smem_rw_scale"}[step]
    return len([m for m in calibrate.MICROS if key in m.name])
  tag = {"again5": "(blind 5)", "blocks": "(block study)", "blind6": "(blind 6)"}[step]
  return len([c for c in timing_suite.cases("families") if tag in c.name])


def test_each_step_of_the_next_call_fits_its_limit_at_the_device_s_speed():
  """The default call's steps, case by case at the speed the H200 showed,
  end inside their limits (and a measure_gpu step's inside its deadline),
  with room for a slower day: a step stopped at its limit loses cases. A
  measure_gpu step starts a chunk of cases only with CHUNK_RESERVE_S left of
  its deadline, so its last chunk must start by then (on 2026-12-07 blind5's
  third chunk, one row, did not)."""
  default, steps = _steps("timing_plan.sh")
  assert set(_DEVICE_S) == set(default)
  for name in default:
    limit, command = steps[name]
    cases = _device_cases(name)
    need = _START_S + cases * _DEVICE_S[name]
    deadline = re.findall(r"--deadline (\d+)", command)
    budget = int(deadline[0]) if deadline else limit
    assert 1.25 * need <= budget, (name, need, budget)
    chunks = re.findall(r"--chunk (\d+)", command)
    chunk = int(chunks[0]) if chunks else 16  # (measure_gpu's --chunk default)
    if deadline and cases > chunk:
      last_starts = _START_S + 1.25 * ((cases - 1) // chunk * chunk) * _DEVICE_S[name]
      assert last_starts + measure_gpu.CHUNK_RESERVE_S <= budget, (
          name, last_starts, budget)


def test_the_library_plan_s_default_fits_one_call():
  default, steps = _steps("library_plan.sh")
  assert default and set(default) <= set(steps)
  assert sum(steps[s][0] for s in default) <= 560
