"""Plain loads of GMEM (no TMA) take the memory's latency: a dependent chain
pays it every load, loads issued back to back overlap, a buffer larger than
half the L2 misses to HBM, and a block's re-reads of a buffer that fits in
its L1 are not charged."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from pallas_sim import gpus

H200 = gpus.H200


def _cycles(kernel, *args):
  r = ps.estimate(kernel, *args, gpu="h200", clock_mhz=H200.boost_mhz)
  return r.kernels[0]


def chase(steps):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.int32))
  def k(x_ref, o_ref):
    j = lax.fori_loop(0, steps, lambda i, j: x_ref[j], jnp.int32(0))
    o_ref[...] = jnp.full((128,), j, jnp.int32)
  return k


def rows_at_once(n):
  """n rows of x loaded one after another, then summed."""
  lay = plgpu.Layout.WGMMA.reduce(1)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64,), jnp.float32))
  def k(x_ref, o_ref):
    vals = [plgpu.load(x_ref.at[i], layout=lay, optimized=False) for i in range(n)]
    o_ref[...] = sum(vals[1:], vals[0])
  return k


def _permutation(nbytes, hop=33):
  count = nbytes // 4
  return jnp.asarray((np.arange(count) + hop) % count, jnp.int32)


def test_a_dependent_chain_pays_the_latency_every_load():
  x = _permutation(1 << 20)  # (1 MiB: past the L1, in the L2)
  per = (_cycles(chase(72), x).block_cycles_max - _cycles(chase(8), x).block_cycles_max) / 64
  assert H200.gmem_load_latency <= per <= H200.gmem_load_latency + 30


def test_a_buffer_past_half_the_l2_misses_to_hbm():
  x = _permutation(H200.l2_bytes)
  per = (_cycles(chase(40), x).block_cycles_max - _cycles(chase(8), x).block_cycles_max) / 32
  want = H200.gmem_load_latency + H200.gmem_hbm_latency_extra
  assert want <= per <= want + 30


def test_loads_issued_back_to_back_overlap():
  x = jnp.ones((4096, 64), jnp.float32)  # (1 MiB)
  one, four = (_cycles(rows_at_once(n), x).block_cycles_max for n in (1, 4))
  assert four - one < 0.25 * H200.gmem_load_latency


def test_a_block_s_rereads_of_a_small_buffer_hit_its_l1():
  x = _permutation(4 << 10)  # (4 KiB: the L1 holds it)
  per = (_cycles(chase(72), x).block_cycles_max - _cycles(chase(8), x).block_cycles_max) / 64
  assert H200.gmem_l1_latency <= per <= H200.gmem_l1_latency + 30
  assert per < 0.6 * H200.gmem_load_latency


def test_a_value_handed_into_a_loop_is_awaited_before_it():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32))
  def k(x_ref, o_ref):
    s = x_ref[0]
    o_ref[...] = jnp.full((128,), lax.fori_loop(0, 4, lambda i, c: c + s, 0.0))
  x = jnp.ones((1 << 18,), jnp.float32)
  assert _cycles(k, x).block_cycles_max >= H200.gmem_load_latency


def test_the_report_names_the_wait():
  kr = _cycles(chase(256), _permutation(1 << 20))
  assert kr.bound == "GMEM load latency"
  assert kr.stalls["GMEM load"] > 0.9


def test_a_chain_of_loads_gives_the_same_answer(rng=np.random.default_rng(0)):
  x = _permutation(1 << 12, hop=int(rng.integers(1, 500)) * 2 + 1)
  got = ps.run(chase(17), x, backend="sim")
  j = 0
  for _ in range(17):
    j = int(x[j])
  np.testing.assert_array_equal(got, np.full(128, j))
