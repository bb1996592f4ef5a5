"""Our own kernel families (lab/families.py, timing_suite's kind "families"):
one configuration of each at its CPU-simulable size runs in the simulator
and matches its float32 reference, as the GPU run checks it there; and the
cases are well formed for lab/measure_gpu.py."""
import argparse

import jax
import numpy as np
import pytest

import pallas_sim as ps

from lab import families, timing_suite

CASES = timing_suite.cases("families")

# One configuration per family (both ways of splitting the warp-specialized
# matmul's block tile, and its single consumer), each deep enough that
# its pipeline refills slots at the sim size.
CHECKED = [
    "own ws_matmul f16 4096x4096x4096 block 128x256x64 2x128x128 split N mcs=2",
    "own ws_matmul f16 8192x2048x8192 block 128x256x64 2x64x256 split M mcs=3",
    "own ws_matmul f16 4096x4096x4096 block 128x128x64 1x128x128 mcs=4",
    "own fp8 matmul e4m3 4096x4096x4096 128x128x128 mcs=6",
    "own rmsnorm bf16 16384x8192 64 rows/block 64x128 mcs=2",
    "own softmax bf16 16384x8192 128 rows/block 128x64 mcs=3",
    "own tma copy f32 16384x4096 512 blocks 32x256 slots=4",
    "own a*b+c*d bf16 16384x4096 1024 blocks 16x128 mcs=4",
    "own attention_mgpu fwd b1 s16384 h4 d128 causal bq64 bkv128 mcs=2",
    # the second set's other element types
    "own tma copy bf16 32768x4096 512 blocks 64x32 slots=8 (blind 2)",
    "own a*b+c*d f32 8192x4096 256 blocks 32x32 mcs=2 (blind 2)",
    # attention at head_dim 64 (the fourth set)
    "own attention_mgpu fwd b2 s4096 h16 d64 bq64 bkv64 mcs=3 (blind 4)",
    # the sixth set's kinds: column sums over several row runs, and the
    # matmul's SiLU epilogue and its bias-only one
    "own colsum bf16 65536x2048 128x128 8 splits (128 blocks) mcs=3 (blind 6)",
    "own matmul+bias+silu bf16 8192x1024x8192 128x128x64 mcs=4 (blind 6)",
    "own matmul+bias+none bf16 4096x4096x4096 128x128x64 mcs=3 (blind 6)",
    "own gelu plain bf16 16384x4096 512 blocks 8x256 unroll=2 (blind 6)",
]


def _rel_err(out, ref):
  out = np.asarray(out, np.float64)
  ref = np.asarray(ref, np.float64)
  return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


@pytest.mark.parametrize("name", CHECKED)
def test_a_configuration_of_each_family_runs_right(name):
  case = timing_suite.by_name(name)
  built = case.make(**timing_suite.sim_params(case))
  out = ps.run(built.fn, *built.args, backend="sim", workers=1)
  assert _rel_err(out, built.reference(*built.args)) <= max(built.tol, 1e-6)


def test_every_family_is_checked():
  assert {timing_suite.by_name(n).family.split(" ")[1] for n in CHECKED} == {
      c.family.split(" ")[1] for c in CASES}


def test_cases_are_well_formed():
  names = [c.name for c in CASES]
  assert len(names) == len(set(names))
  assert len({c.family for c in CASES}) >= 6
  for c in CASES:
    assert c.name.startswith("own ") and c.family.startswith("own "), c.name
    # (a matmul's loads alone, mma=False, does no FLOPs)
    assert c.family and c.bytes > 0, c.name
    assert c.flops > 0 or c.params.get("mma") is False, c.name


def test_bytes_are_every_input_and_output_once():
  """`bytes` is the fewest HBM bytes: each input read once, each output
  written once (shapes at the GPU size, nothing drawn or run; traced with
  the simulated GPU's device properties, which attention_mgpu reads)."""
  from pallas_sim.backends.sim.frontend.device import simulated
  size = lambda x: x.size * x.dtype.itemsize
  for c in CASES:
    with timing_suite.shapes_only():
      built = c.build()
    with simulated():
      out = jax.eval_shape(built.fn, *built.args)
    want = sum(map(size, built.args)) + sum(map(size, jax.tree.leaves(out)))
    assert c.bytes == want, c.name


def test_measure_gpu_selects_the_families():
  ap = argparse.ArgumentParser()
  timing_suite.add_kind_args(ap)
  assert timing_suite.kind_of(ap.parse_args(["--families"])) == "families"
  assert timing_suite.kind_of(ap.parse_args([])) == "suite"
  assert families.family_cases()[0].name == CASES[0].name
