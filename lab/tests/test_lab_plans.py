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
