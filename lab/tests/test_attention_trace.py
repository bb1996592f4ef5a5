"""lab/attention_trace.py: JAX's attention kernel, run as users run it, with
its KV step's phases in named scopes for Mosaic GPU's profiler; read back
phase by phase, and what a step costs whatever its size, phase by phase."""

import numpy as np
import pytest

import pallas_sim as ps

from lab import attention_trace as at

CASE = (1, 512, 1, 128, 64, 64, 2)  # (4 blocks, 8 KV steps a compute warpgroup)


def test_the_scoped_kernel_is_still_attention_and_gives_each_step_its_phases(tmp_path):
  from jax.experimental.pallas.ops.gpu import attention_mgpu as am
  real = am.plgpu, am.pl
  q, k, v = at._operands(CASE)
  with ps.backend("sim"):
    out = at.attention(q, k, v, CASE, profile_dir=str(tmp_path))
  assert (am.plgpu, am.pl) == real  # (the module's own again)
  ref = am.attention_reference(q, k, v)
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32),
                             atol=2e-2, rtol=2e-2)
  m = at.steps_of(at.pt.newest_trace(str(tmp_path)), CASE)
  assert m["steps"] == 8 and m["warpgroups"] == 8  # (two compute warpgroups a block)
  for p in at.PARTS:
    assert m[p] is not None and m[p]["median"] >= 0, p
  # The phases a step runs one after another add up to it; the waits inside
  # qk and pv lie within them.
  serial = sum(m[p]["median"] for p in ("qk", "softmax", "wait v_barriers",
                                        "wait schedule_barrier", "pv", "rest"))
  assert serial == pytest.approx(m["step"]["median"], rel=0.1)
  assert m["qk wait schedule_barrier"]["median"] <= m["qk"]["median"]
  assert m["pv wait k_barriers"]["median"] <= m["pv"]["median"]


def test_fixed_cost_by_part_solves_each_phase_like_the_whole_step():
  """Two runs of the same work in 8 and 16 steps: a phase's fixed cost is
  (its cycles a block at 16 - at 8) / 8."""
  row = lambda steps, per: {"steps": steps, **{p: {"median": per[p]} for p in per}}
  a = row(8, {"qk": 800.0, "softmax": 1200.0, "step": 3000.0})
  b = row(16, {"qk": 450.0, "softmax": 650.0, "step": 1700.0})
  f = at.fixed_by_part(a, b)
  assert f == {"qk": (450 * 16 - 800 * 8) / 8, "softmax": (650 * 16 - 1200 * 8) / 8,
               "step": (1700 * 16 - 3000 * 8) / 8}
  assert at.name_of(CASE) == "attention fwd b1 s512 h1 d128 bq64 bkv64 mcs=2"
