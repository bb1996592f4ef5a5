"""ps.estimate: predicted times without values, from one block per class of
blocks that do the same work (backends/sim/blocks/block_classes.py); equal to the
full simulation's wherever both run."""
import dataclasses
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from pallas_sim import gpus
from pallas_sim.backends.sim.blocks import block_classes
from test_machine import copy_kernel
from test_quickstart import matmul_mcs

F16, F32 = jnp.float16, jnp.float32
S = jax.ShapeDtypeStruct
SMS = gpus.H100.num_sms


def _times(report):
  return [(k.time_s, k.block_cycles_min, k.block_cycles_mean, k.block_cycles_max,
           k.tma_load_bytes, k.tma_store_bytes, k.wgmma_flops, k.utilisation, k.stalls,
           k.bound) for k in report.kernels]


def _close(a, b):
  """Equal but for float rounding (1e-9 relative), through lists and dicts:
  an estimate that sums a persistent loop's iterations (execute/extrapolate.py)."""
  if isinstance(a, dict):
    return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
  if isinstance(a, (list, tuple)):
    return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
  if isinstance(a, (float, np.floating)):
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-30)
  return a == b


def _full(fn, *args, **kw):
  return ps.simulate(fn, *args, check_races=False, check_uninitialized=False,
                     workers=1, **kw).report


def _wide_matmul(a, b):  # (two k-steps: blocks are quick to simulate)
  return matmul_mcs(a, b, tile_n=128, tile_k=64)


def test_estimate_equals_the_full_simulation_from_two_blocks():
  """18 x 18 = 324 blocks, two per SM: two waves, the second not full, so
  two classes (blocks sharing an SM with another, and alone); one block of
  each is simulated."""
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.standard_normal((18 * 128, 128)), F16)
  b = jnp.asarray(rng.standard_normal((128, 18 * 128)), F16)
  full = _full(_wide_matmul, a, b)
  est = ps.estimate(_wide_matmul, S(a.shape, F16), S(b.shape, F16))
  [k] = est.kernels
  assert (k.num_blocks, k.waves, k.blocks_per_sm) == (324, 2, 2)
  assert k.simulated_blocks == 2 and "2 of 324 blocks simulated" in k.classes
  assert _times(est) == _times(full)
  assert "estimate: control flow is the same in every block" in est.summary()
  # (it looked for no races: it says so, not "0 race(s)")
  assert "launch(es), races not checked, uninitialized memory not checked" in \
      est.summary().splitlines()[0]
  assert "0 race(s)" in ps.simulate(_wide_matmul, a, b).report.summary().splitlines()[0]
  # (arrays work too, and give the same)
  assert _times(ps.estimate(_wide_matmul, a, b)) == _times(full)


def _when_first(x):
  @plgpu.kernel(out_type=S((8, 128), F32), grid=(8,), grid_names=("b",))
  def k(x_ref, o_ref):
    b = lax.axis_index("b")
    o_ref[b] = x_ref[b]

    @pl.when(b == 0)
    def _():
      o_ref[b] = x_ref[b] * 2.0 + 1.0
  return k(x)


def _data_loop(x):
  @plgpu.kernel(out_type=S((8, 128), F32), grid=(8,), grid_names=("b",))
  def k(x_ref, o_ref):
    b = lax.axis_index("b")
    n = x_ref[b, 0].astype(jnp.int32)

    def body(i, acc):
      return acc + 1.0
    o_ref[b] = jnp.full((128,), lax.fori_loop(0, n, body, 0.0))
  return k(x)


def test_control_flow_on_the_block_index_is_followed_block_by_block():
  """Block 0 takes a branch the others do not: two paths, one block of
  each simulated (backends/sim/blocks/paths.py), the same times as all eight."""
  x = jnp.arange(8 * 128, dtype=F32).reshape(8, 128)
  est = ps.estimate(_when_first, S(x.shape, F32))
  [k] = est.kernels
  assert k.simulated_blocks == 2
  assert k.classes.startswith("control flow depends on the block's grid index (")
  assert "test_estimate.py:" in k.classes and "by the path each block takes" in k.classes
  assert _times(est) == _times(_full(_when_first, x))
  # block 0 does more work: classes by SM share alone would have been wrong
  assert k.block_cycles_max > k.block_cycles_min


def _first_carry_decides(x):
  """The carry is 2 before the first step and the block index after: the
  first comparison is true only in block 2."""
  @plgpu.kernel(out_type=S((4, 128), F32), grid=(4,), grid_names=("b",))
  def k(x_ref, o_ref):
    b = lax.axis_index("b")

    def step(i, c):
      last, v = c
      v = lax.cond(last == b, lambda u: u * 2.0 + 1.0, lambda u: u, v)
      return b, v
    o_ref[b] = lax.fori_loop(0, 3, step, (jnp.int32(2), x_ref[b]))[1]
  return k(x)


def test_a_carry_linear_only_after_its_first_step_still_decides():
  x = jnp.ones((4, 128), F32)
  est = ps.estimate(_first_carry_decides, S(x.shape, F32))
  assert "grid index" in est.kernels[0].classes
  assert _times(est) == _times(_full(_first_carry_decides, x))
  assert est.kernels[0].block_cycles_max > est.kernels[0].block_cycles_min


def test_control_flow_on_data_given_follows_each_blocks_path_on_its_data():
  """x given: each block's trip count is read from it by the slice
  (blocks/paths.py known_reads), and the loops' iterations time them all
  (execute/extrapolate.py): the full simulation's times, to rounding."""
  x = (jnp.arange(8, dtype=F32)[:, None] * 3 + jnp.zeros((8, 128), F32))
  est = ps.estimate(_data_loop, x)
  [k] = est.kernels
  assert k.simulated_blocks < 8 and "values read from memory" in k.classes
  assert "persistent loop's 84 iterations over 8 blocks" in k.classes
  assert _close(_times(est), _times(_full(_data_loop, x)))
  assert k.block_cycles_max > k.block_cycles_min  # (trip counts 0..21)
  with pytest.warns(ps.EstimateWarning, match=r"test_estimate.py:\d+: a loop's trip "
                    r"count\), and x_ref was given as a shape"):
    shapes = ps.estimate(_data_loop, S(x.shape, F32)).kernels[0]
  assert shapes.classes.endswith("on zeros for the inputs given as shapes (x_ref)")


def _counted_rows(x, counts):
  """Block b adds 1 to its row counts[b] times: the trip count is read from
  the second input."""
  @plgpu.kernel(out_type=S((8, 128), F32), grid=(8,), grid_names=("b",))
  def k(x_ref, n_ref, o_ref):
    b = lax.axis_index("b")
    o_ref[b] = lax.fori_loop(0, n_ref[b], lambda i, acc: acc + 1.0, x_ref[b])
  return k(x, counts)


COUNTS = np.array([0, 40, 3, 17, 0, 29, 8, 1], np.int32)


def _with_captured_counts(x):
  return _counted_rows(x, jnp.asarray(COUNTS))  # (a constant of the function)


def test_constants_the_function_captures_keep_their_values_in_an_estimate():
  """Given x as a shape, an estimate has no values for x (zeros stand in),
  but the trip counts are a constant of the function: the blocks take the
  paths those counts give, as in the full simulation."""
  x = jnp.ones((8, 128), F32)
  with warnings.catch_warnings():
    warnings.simplefilter("error", ps.EstimateWarning)  # (no decision reads x)
    est = ps.estimate(_with_captured_counts, S(x.shape, F32))
  assert _close(_times(est), _times(_full(_with_captured_counts, x)))
  [k] = est.kernels
  assert k.block_cycles_max > 2 * k.block_cycles_min  # (0 to 40 trips)
  assert k.classes.endswith("on the values of the inputs it was given")


def test_an_estimate_names_the_input_given_as_a_shape_that_decides():
  """The trip counts given as a shape: zeros stand in for them, every block
  takes no trip, and the estimate says so, naming the input and the line."""
  x = jnp.ones((8, 128), F32)
  with pytest.warns(ps.EstimateWarning) as got:
    est = ps.estimate(_counted_rows, x, S((8,), jnp.int32))
  [w] = [w for w in got if issubclass(w.category, ps.EstimateWarning)]
  assert "n_ref was given as a shape" in str(w.message)
  assert "test_estimate.py:" in str(w.message)
  # (issued at that line, not at the simulator's frame that found it)
  assert w.filename.endswith("test_estimate.py") and f"py:{w.lineno}:" in str(w.message)
  zeros = _full(_counted_rows, x, jnp.zeros((8,), jnp.int32))
  assert _times(est) == _times(zeros)
  assert est.kernels[0].classes.endswith("on zeros for the inputs given as shapes (n_ref)")
  with warnings.catch_warnings():
    warnings.simplefilter("error", ps.EstimateWarning)  # (values given: no warning)
    est = ps.estimate(_counted_rows, x, jnp.asarray(COUNTS))
  assert _close(_times(est), _times(_full(_counted_rows, x, jnp.asarray(COUNTS))))
  # Both given as shapes: only the counts decide, and only they are named.
  with pytest.warns(ps.EstimateWarning, match=r"\), and n_ref was given as a shape"):
    est = ps.estimate(_counted_rows, S(x.shape, F32), S((8,), jnp.int32))
  assert est.kernels[0].classes.endswith("on zeros for the inputs given as shapes (n_ref)")


def test_variation_sees_through_nested_jaxprs_and_loops():
  def jaxpr_of(fn, *shapes):
    return jax.make_jaxpr(fn, axis_env=[("b", 4)])(*shapes).jaxpr

  def loop_carry_from(start):
    def f(x):
      def body(c):
        i, v = c
        return i + 1, v * 2.0
      return lax.while_loop(lambda c: c[0] < 4, body, (start(x), x))[1]
    return f
  assert block_classes.variation(
      jaxpr_of(loop_carry_from(lambda x: 0), S((), F32)), ("b",)) is None
  # the trip count from an input: data
  why, _ = block_classes.variation(
      jaxpr_of(loop_carry_from(lambda x: x.astype(jnp.int32)), S((), F32)), ("b",),
      data_inputs=(0,))
  assert why == block_classes.DATA
  # ... from the grid index
  why, where = block_classes.variation(jaxpr_of(
      loop_carry_from(lambda x: lax.axis_index("b")), S((), F32)), ("b",))
  assert why == block_classes.GRID and "test_estimate.py:" in where

  def switch_inside_scan(x):
    def body(c, _):
      return lax.cond(c > 2.0, lambda v: v, lambda v: v + 1.0, c), None
    return lax.scan(body, x, None, length=3)[0]
  why, _ = block_classes.variation(jaxpr_of(switch_inside_scan, S((), F32)), ("b",),
                                   data_inputs=(0,))
  assert why == block_classes.DATA
  # (a cond on a value nothing read from memory nor the grid index)
  assert block_classes.variation(
      jaxpr_of(switch_inside_scan, S((), F32)), ("b",)) is None
  assert block_classes.variation(
      jaxpr_of(lambda x: lax.scan(lambda c, _: (c + 1.0, None), x, None, length=3)[0],
               S((), F32)), ("b",)) is None


@settings(max_examples=6, deadline=None)
@given(nblocks=st.integers(1, 3 * SMS + 7), per_sm=st.sampled_from([1, 2, 3]),
       gpu=st.sampled_from(["h100", "h200"]))
def test_estimate_equals_full_simulation_for_any_grid_and_occupancy(nblocks, per_sm, gpu):
  # SMEM sized so that per_sm blocks fit on an SM
  smem_floats = (gpus.H100.smem_per_sm // per_sm - 34 * 1024 - 1024) // 4
  k = copy_kernel(nblocks, smem_floats)
  x = jnp.ones((nblocks, 64, 128), F32)
  est = ps.estimate(k, S(x.shape, F32), gpu=gpu)
  full = _full(k, x, gpu=gpu)
  assert est.kernels[0].blocks_per_sm == per_sm
  assert _times(est) == _times(full)
  assert est.kernels[0].simulated_blocks <= 2


def test_estimate_computes_no_values_and_checks_nothing_it_need_not():
  rng = np.random.default_rng(1)
  a = jnp.asarray(rng.standard_normal((256, 256)), F16)
  est = ps.estimate(matmul_mcs, a, a)
  assert est.kernels[0].time_s == _full(matmul_mcs, a, a).kernels[0].time_s
  assert est.races == [] and est.uninitialized == []
  with pytest.raises(ValueError, match="gpu='a100'"):
    ps.estimate(matmul_mcs, a, a, gpu="a100")


def test_control_flow_on_the_block_index_inside_a_scope_is_seen():
  """The index computed outside a run_scoped and used inside it (its body
  takes what it closes over as constvars)."""
  @plgpu.kernel(out_type=S((8, 128), F32), grid=(8,), grid_names=("b",))
  def k(x_ref, o_ref):
    b = lax.axis_index("b")

    def scoped(smem):
      smem[...] = x_ref[b]

      @pl.when(b == 3)
      def _():
        smem[...] = smem[...] * 2.0
      o_ref[b] = smem[...]
    pl.run_scoped(scoped, plgpu.SMEM((128,), F32))
  est = ps.estimate(k, S((8, 128), F32)).kernels[0]
  assert est.simulated_blocks == 2 and "grid index" in est.classes
  assert _times(ps.estimate(k, S((8, 128), F32))) == _times(
      _full(k, jnp.ones((8, 128), F32)))


def test_load_sites_know_which_grid_axes_their_address_depends_on():
  """The quickstart matmul: A's tiles follow the grid's m axis, B's its n
  axis (through emit_pipeline's index maps)."""
  from pallas_sim.backends.sim.execute.executor import Executor
  seen = {}
  real = Executor.prepare

  def spy(self, launch):
    p = real(self, launch)
    seen["axes"] = p.load_axes
    return p
  a = jnp.ones((256, 256), F16)
  try:
    Executor.prepare = spy
    ps.estimate(matmul_mcs, a, a)
  finally:
    Executor.prepare = real
  assert sorted(set(seen["axes"].values())) == [(0,), (1,)]


def test_l2_serves_what_the_blocks_of_a_wave_share():
  from pallas_sim.backends.sim.timing.model import Timing
  h = gpus.H200
  lt = Timing(h).launch(4 * SMS, 150 * 1024, 1)  # one block per SM: 4 waves
  index = np.array([(i // 8, i % 8) for i in range(4 * SMS)])
  mb = 2 ** 20
  # site 0 follows axis 0, site 1 axis 1; 1 MiB per block in 16 loads
  sites = {0: [4 * SMS * mb, 4 * SMS * 16], 1: [4 * SMS * mb, 4 * SMS * 16]}
  axes = {0: (0,), 1: (1,)}
  lt.set_loads(index, axes)
  got = lt.hbm_reads(sites, input_bytes=10 ** 12)
  per_wave = [len(set(index[w * SMS:(w + 1) * SMS, 0])) + 8 for w in range(4)]
  assert got == sum(per_wave) * mb
  # an address read from memory: every block reads its own
  lt.set_loads(index, {0: None, 1: (1,)})
  assert lt.hbm_reads(sites, 10 ** 12) == sum(
      SMS + 8 for _ in range(4)) * mb
  # inputs that fit in the L2 are read once
  lt.set_loads(index, axes)
  assert lt.hbm_reads(sites, input_bytes=3 * mb) == 3 * mb
  # what a wave reads at once past the L2: misses (one load of 1 GiB per block)
  big = {0: [4 * SMS * 2 ** 30, 4 * SMS]}
  lt.set_loads(index, {0: (0,)})
  spill = lt.hbm_reads(big, 10 ** 15)
  fits = sum(len(set(index[w * SMS:(w + 1) * SMS, 0])) for w in range(4)) * 2 ** 30
  assert fits < spill < 4 * SMS * 2 ** 30


def test_traced_l2_reads_each_source_once_while_it_stays():
  """Where the L2 model follows loads: a wave's loads in issue order through
  an LRU L2; a source read again while it is there costs no HBM bytes."""
  from pallas_sim.backends.sim.timing.model import Timing
  h = gpus.H200
  lt = Timing(h).launch(2 * SMS, 150 * 1024, 1)  # one per SM: two waves
  tile, own = 2 ** 20, 2 ** 16
  # every block of both waves reads tiles 0..3 of "a", and one of its own
  loads = {b: [(float(i), ("a", i * tile, (512, 512)), tile) for i in range(4)]
           + [(5.0, ("b", b * own, (128, 128)), own)] for b in range(2 * SMS)}
  assert lt.hbm_reads_traced(loads) == 4 * tile + 2 * SMS * own
  # an L2 too small for what a wave reads: the shared tiles are evicted by
  # the blocks' own before the next wave reads them again
  small = Timing(dataclasses.replace(h, l2_bytes=8 * tile)).launch(2 * SMS, 150 * 1024, 1)
  assert small.hbm_reads_traced(loads) == 2 * 4 * tile + 2 * SMS * own


def test_estimate_follows_loads_where_blocks_take_different_paths():
  """A persistent-style kernel: each block loops over tiles from its index,
  so the per-site model cannot group its loads; the traced one does, and
  estimate and simulate agree."""
  nsm, tiles = 4, 12

  def persistent(x):
    @plgpu.kernel(out_type=S((nsm, 64, 128), F32), grid=(nsm,), grid_names=("b",),
                  scratch_types=[plgpu.SMEM((64, 128), F32), plgpu.Barrier()])
    def k(x_ref, o_ref, smem, bar):
      b = lax.axis_index("b")

      def step(t, c):
        plgpu.copy_gmem_to_smem(x_ref.at[lax.rem(t, 3)], smem, bar)
        plgpu.barrier_wait(bar)
        return c
      lax.fori_loop(b, tiles, step, None)   # (trip count from the block index)
      plgpu.copy_smem_to_gmem(smem, o_ref.at[b])
      plgpu.wait_smem_to_gmem(0)
    return k(x)
  x = jnp.ones((3, 64, 128), F32)
  est = ps.estimate(persistent, S(x.shape, F32)).kernels[0]
  assert est.simulated_blocks == nsm
  assert est.hbm_bytes == 3 * 64 * 128 * 4 + nsm * 64 * 128 * 4  # 3 tiles once
  assert _times(ps.estimate(persistent, S(x.shape, F32))) == _times(_full(persistent, x))


def test_control_flow_on_tensor_core_sums_takes_the_simulations_paths():
  """A loop whose trip count comes from a wgmma's result: given arrays,
  estimate computes the sums too, and times the paths simulate takes."""
  # (The count is read back from GMEM, after the store: jax 0.12's layout
  # inference finds no layouts, after minutes, where it is read from the
  # SMEM the accumulator was stored to and the loop's result meets it.)
  def kernel(a, bt):
    @plgpu.kernel(out_type=(S((64, 64), F32), S((128,), F32)),
                  scratch_types=dict(a_s=plgpu.SMEM((64, 32), F32),
                                     b_s=plgpu.SMEM((64, 32), F32),
                                     acc=plgpu.ACC((64, 64), F32),
                                     o_s=plgpu.SMEM((64, 64), F32),
                                     bar=plgpu.Barrier(num_arrivals=2)))
    def k(a_ref, b_ref, o_ref, x_ref, a_s, b_s, acc, o_s, bar):
      plgpu.copy_gmem_to_smem(a_ref, a_s, bar)
      plgpu.copy_gmem_to_smem(b_ref, b_s, bar)
      plgpu.barrier_wait(bar)
      plgpu.wgmma(acc, a_s, b_s.T)
      o_s[...] = acc[...]
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(o_s, o_ref)
      plgpu.wait_smem_to_gmem(0)
      n = o_ref[0, 0].astype(jnp.int32)
      x_ref[...] = lax.fori_loop(0, n, lambda i, c: c * 0.5 + 1.0, jnp.zeros((128,), F32))
    return k(a, bt)
  a = jnp.zeros((64, 32), F32).at[0, 0].set(40.0)
  bt = jnp.zeros((64, 32), F32).at[0, 0].set(1.0)
  est = ps.estimate(kernel, a, bt).kernels[0]
  full = _full(kernel, a, bt).kernels[0]
  assert "values read from memory" in est.classes
  assert est.block_cycles_max == full.block_cycles_max
  # (40 trips of the loop: without the sums it would run none)
  with pytest.warns(ps.EstimateWarning, match="zeros stand in for them"):
    none = ps.estimate(kernel, S(a.shape, F32), S(bt.shape, F32)).kernels[0]
  assert full.block_cycles_max > none.block_cycles_max + 40 * 10


@pytest.mark.parametrize("name", [e[0] for e in __import__("kernels").EXAMPLES
                                  if e[0] not in __import__("kernels").NOT_LOWERABLE])
def test_estimate_equals_simulate_on_every_example_kernel(name):
  """Shapes or arrays, one block per class or all: the times simulate gives."""
  import kernels as K
  fn, make_args = [(e[1], e[2]) for e in K.EXAMPLES if e[0] == name][0]
  args = make_args(0)
  full = _full(fn, *args)
  assert _times(ps.estimate(fn, *args)) == _times(full)
  shapes = [S(np.shape(a), np.asarray(a).dtype) for a in args]
  est = ps.estimate(fn, *shapes)
  if all("values read from memory" not in k.classes for k in est.kernels):
    assert _times(est) == _times(full)


def test_block_classes_in_simulate_need_the_checks_off():
  a = jnp.ones((256, 256), F16)
  with pytest.raises(ValueError, match="block_classes=True simulates some blocks only"):
    ps.simulate(matmul_mcs, a, a, block_classes=True)
  rep = ps.simulate(matmul_mcs, a, a, block_classes=True, check_races=False,
                    check_uninitialized=False).report
  assert rep.kernels[0].simulated_blocks == 1


def test_a_decision_on_data_outranks_one_on_the_grid():
  """Whether an estimate given arrays computes values hangs on any decision
  reading data, not only on the first decision found."""
  def k(x):
    b = lax.axis_index("b")
    y = lax.cond(b > 1, lambda v: v + 1.0, lambda v: v, x)
    return lax.cond(y > 2.0, lambda v: v * 2.0, lambda v: v, y)
  jaxpr = jax.make_jaxpr(k, axis_env=[("b", 4)])(S((), F32)).jaxpr
  why, where = block_classes.variation(jaxpr, ("b",), data_inputs=(0,))
  assert why == block_classes.DATA and "test_estimate.py:" in where


def test_without_numerics_float_math_is_not_computed():
  """An estimate (numerics off, no decision on data) skips float math: no
  time depends on it. Integer math, which addresses and trip counts use,
  is still computed."""
  from pallas_sim.backends.sim.interpret.compiler import Compiler
  from pallas_sim.backends.sim.timing.model import Timing
  from pallas_sim import gpus as _gpus
  jaxpr = jax.make_jaxpr(lambda x, i: (jnp.exp(x) + 1.0, i * 3 + 1))(
      S((4, 128), F32), S((), jnp.int32))
  x, i = np.full((4, 128), 0.5, np.float32), np.int32(5)
  for skip in (False, True):
    cx = Compiler(Timing(_gpus.H200), None, numerics=not skip, skip_float_values=skip)
    prog = cx.compile(jaxpr)
    env = list(prog.template)
    for s_, v in zip(prog.invars, (x, i)):
      env[s_] = v
    for st in prog.steps:
      r = st.fn(None, *(env[j] for j in st.ins))
      for s_, v in zip(st.outs, r if st.multi else (r,)):
        env[s_] = v
    f, n = (env[s_] for s_ in prog.outvars)
    assert int(n) == 16
    np.testing.assert_array_equal(f, 0.0 if skip else np.exp(x) + 1.0)


def _boxed_loop(decide_on):
  """A fori_loop (a scan) carrying an index and a running max of data, a
  pl.run_state inside deciding on the index (as JAX's attention kernel does
  around its wgmmas) or on the data it boxes."""
  def kern(x_ref, o_ref):
    def body(i, carry):
      acc, m = carry
      m = jnp.maximum(m, x_ref[...])

      def inside(refs):
        idx_ref, acc_ref = refs
        w = idx_ref[...] + 1
        pred = {"index": w < 4, "box": jnp.sum(acc_ref[...]) > 2.0,
                "memory": jnp.sum(x_ref[...]) > 2.0}[decide_on]

        @pl.when(pred)
        def _():
          acc_ref[...] += 1.0
      _, acc = pl.run_state(inside)((i, acc + m))
      return acc, m
    zeros = jnp.zeros((128,), F32)
    o_ref[...] = lax.fori_loop(0, 4, body, (zeros, zeros))[0]
  return plgpu.kernel(kern, out_type=S((128,), F32), grid=(6,), grid_names=("b",))


def test_run_state_boxes_values_and_scan_carries_keep_their_own_taints():
  """pl.run_state's refs hold values, not memory: a decision on the loop
  index it boxes does not depend on data (a scan's carries each keep their
  own taint), one on the data it boxes does, and so does one on a kernel
  ref read inside it."""
  x = jnp.arange(128, dtype=F32)
  k = _boxed_loop("index")
  est = ps.estimate(k, S(x.shape, F32))
  assert est.kernels[0].simulated_blocks == 1
  assert _times(est) == _times(_full(k, x))
  for on in ("box", "memory"):  # (a kernel ref read inside stays memory)
    with pytest.warns(ps.EstimateWarning, match="zeros stand in"):
      data = ps.estimate(_boxed_loop(on), S(x.shape, F32)).kernels[0]
    assert data.simulated_blocks == 6 and "values read from memory" in data.classes


def test_float_math_that_decides_is_computed():
  """A trip count from float math on the grid index: the estimate computes
  that float math (skipping it would give every block one trip) and equals
  the full simulation."""
  def k(x):
    def body(x_ref, o_ref):
      b = lax.axis_index("b")
      row = jnp.full((128,), 1.5, F32) * b.astype(F32)  # (a vector: what estimate skips)
      n = jnp.max(row).astype(jnp.int32) + 1
      o_ref[b] = lax.fori_loop(0, n, lambda i, v: v * 0.5 + 1.0, x_ref[b])
    return plgpu.kernel(body, out_type=S(x.shape, F32), grid=(4,), grid_names=("b",))(x)
  x = jnp.ones((4, 128), F32)
  est = ps.estimate(k, S(x.shape, F32))
  assert _times(est) == _times(_full(k, x))
  assert est.kernels[0].block_cycles_max > est.kernels[0].block_cycles_min


def test_the_estimate_check_compares_every_simulated_launch(tmp_path, monkeypatch):
  """PALLAS_SIM_CHECK_ESTIMATE (backends/sim/execute/estimate_check.py, which
  benchmarks/jax_suite.py --check-estimate turns on for JAX's suite): each
  simulated launch is estimated again; a line per launch says both times,
  or what the estimate raised, which does not disturb the simulation."""
  from pallas_sim.backends.sim.execute import estimate_check
  from pallas_sim.backends.sim.execute.executor import Executor
  log = tmp_path / "checks.jsonl"
  monkeypatch.setenv(estimate_check.ENV, str(log))
  rng = np.random.default_rng(1)
  a = jnp.asarray(rng.standard_normal((4 * 128, 128)), F16)
  b = jnp.asarray(rng.standard_normal((128, 2 * 128)), F16)
  full = _full(_wide_matmul, a, b)
  [line] = [json.loads(x) for x in log.read_text().splitlines()]
  assert line["simulated_s"] == full.kernels[0].time_s == line["estimated_s"]
  assert line["error"] == 0.0 and "control flow is the same" in line["classes"]
  assert line["tallies"] == {}
  assert "test_quickstart.py:" in line["where"]

  real = Executor.run_launch

  def broken(self, launch, arrays, copy_inputs=False):
    if self.checking_estimate:
      raise RuntimeError("the estimate broke")
    return real(self, launch, arrays, copy_inputs)
  monkeypatch.setattr(Executor, "run_launch", broken)
  again = _full(_wide_matmul, a, b)
  assert _times(again) == _times(full)
  last = json.loads(log.read_text().splitlines()[-1])
  assert last["raised"] == "RuntimeError: the estimate broke"
  assert "estimated_s" not in last

  class SuiteTimeout(Exception):  # (a test's time limit, raised by a signal)
    pass

  def timed_out(self, launch, arrays, copy_inputs=False):
    if self.checking_estimate:
      raise SuiteTimeout("past the time limit")
    return real(self, launch, arrays, copy_inputs)
  monkeypatch.setattr(Executor, "run_launch", timed_out)
  lines = len(log.read_text().splitlines())
  with pytest.raises(SuiteTimeout):  # (passes through: not the estimate's failure)
    _full(_wide_matmul, a, b)
  assert len(log.read_text().splitlines()) == lines


def test_the_estimate_check_times_at_the_clock_the_simulation_took(tmp_path, monkeypatch):
  """A launch over the power limit at the boost clock is timed at the clock
  its power allows (timing/power.py); the estimate check's estimate goes the
  same way, as ps.estimate does: the two times are equal."""
  from pallas_sim.backends.sim.execute import estimate_check
  log = tmp_path / "checks.jsonl"
  monkeypatch.setenv(estimate_check.ENV, str(log))
  a = jnp.asarray(np.random.default_rng(2).standard_normal((2048, 2048)), F16)
  sim = ps.simulate(lambda a, b: matmul_mcs(a, b, tile_n=128, max_concurrent_steps=4),
                    a, a, gpu="h200", numerics=False, check_races=False,
                    check_uninitialized=False).report.kernels[0]
  assert sim.sm_mhz < 1980
  [line] = [json.loads(x) for x in log.read_text().splitlines()]
  assert line["estimated_s"] == line["simulated_s"] == sim.time_s
