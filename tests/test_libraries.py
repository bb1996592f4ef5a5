"""What a third-party kernel library needs to run unmodified: its device
dispatch sees a Hopper GPU (ps.present_gpu, --pallas-sim-present-gpu), its
custom_vjp ops differentiate (optimize_remat, jax.checkpoint) on every JAX of
the window, and outputs its contract leaves partly unwritten can be declared
(ps.leave_unwritten)."""
import functools
import inspect
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.extend import backend

import pallas_sim as ps
from pallas_sim.backends import mosaic


def ragged_rows(x, n):
  """A library's kernel whose contract writes only the rows below n[0] (a
  multiple of 64): a ragged output, as a ragged dot leaves rows past the sum
  of its group sizes."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,),
                grid_names=("b",), kernel_name="ragged_rows",
                scratch_types=[plgpu.SMEM((64, 128), jnp.float32), plgpu.Barrier()])
  def k(x_ref, n_ref, o_ref, smem, bar):
    b = lax.axis_index("b")

    @pl.when(b * 64 < n_ref[0])
    def _():
      plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(b * 64, 64)], smem, bar)
      plgpu.barrier_wait(bar)
      plgpu.copy_smem_to_gmem(smem, o_ref.at[pl.ds(b * 64, 64)])
      plgpu.wait_smem_to_gmem(0)
  return k(x, n)


# The same kernel as a library module of its own, for a subprocess's tests.
RAGGED = textwrap.dedent('''
    import jax, jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu
''') + "\n" + inspect.getsource(ragged_rows)
X = jnp.arange(256 * 128, dtype=jnp.float32).reshape(256, 128)
N = jnp.array([128], jnp.int32)


def _rows_below_n(x, n):
  return {0: np.s_[int(n[0]):]}


def test_an_unwritten_tail_fails_without_a_declaration():
  with pytest.raises(ps.UninitializedError, match=r"never written"):
    ps.run(ragged_rows, X, N, backend="sim")


def test_a_declared_tail_may_stay_unwritten():
  with ps.leave_unwritten("ragged_rows", _rows_below_n):
    out = ps.run(ragged_rows, X, N, backend="sim")
  np.testing.assert_array_equal(np.asarray(out)[:128], np.asarray(X)[:128])
  # (the declaration ended with its block)
  with pytest.raises(ps.UninitializedError):
    ps.run(ragged_rows, X, N, backend="sim")


def test_what_a_declaration_does_not_cover_is_still_reported():
  too_short = lambda x, n: {"o_ref": np.s_[int(n[0]) + 64:]}
  with ps.leave_unwritten("ragged_rows", too_short):
    with pytest.raises(ps.UninitializedError) as e:
      ps.run(ragged_rows, X, N, backend="sim")
  msg = str(e.value)
  assert "o_ref[128:192, 0:128]" in msg and "o_ref[192:" not in msg
  assert "besides the region declared with ps.leave_unwritten" in msg


def test_a_bad_declaration_is_named_at_the_line_that_made_it():
  here = f"{os.path.relpath(__file__)}:"
  bad = [(lambda x, n: {3: np.s_[:]},
          r"output 3 is not one of the kernel's 1 outputs \(o_ref\)"),
         (lambda x, n: {0: np.zeros((3, 128), bool)},
          r"the mask for output 0 has shape \(3, 128\), the output \(256, 128\)"),
         (lambda x, n: {0: np.s_[int(n[0]) // 0:]},
          r"the region function raised ZeroDivisionError: integer division or modulo by "
          r"zero")]
  for region, text in bad:
    line = inspect.currentframe().f_lineno + 1
    with ps.leave_unwritten("ragged_rows", region):
      with pytest.raises(ps.KernelError, match=text) as e:
        ps.run(ragged_rows, X, N, backend="sim")
    assert e.value.where == f"{here}{line}", (e.value.where, line)
  with pytest.raises(TypeError, match=r"region must be a function of the kernel's inputs"):
    ps.leave_unwritten("ragged_rows", {0: np.s_[:]})


def test_present_gpu_shows_a_hopper_to_device_queries_and_nothing_else():
  dev = jax.devices()[0]
  before = (dev.platform, dev.device_kind, jax.default_backend())
  with ps.present_gpu("h200"):
    d = backend.get_default_device()
    assert (d.platform, d.device_kind, d.compute_capability, d.core_count) == (
        "gpu", "NVIDIA H200", "9.0", 132)
    assert jax.default_backend() == "gpu"
    # JAX still computes on the CPU, and the real backend is not fooled.
    assert float(jax.jit(lambda x: x * 2)(jnp.float32(2))) == 4.0
    assert mosaic.hopper_device() is None
    assert "cpu:cpu" in mosaic.describe_devices()
    with pytest.raises(ps.BackendError):
      ps.run(lambda: None, backend="mosaic")
    with ps.present_gpu("h100"):  # (nested: the outer one stays)
      assert d.device_kind == "NVIDIA H200"
  assert (dev.platform, dev.device_kind, jax.default_backend()) == before
  assert not hasattr(dev, "compute_capability")


def _scale(x, by):
  @functools.partial(plgpu.kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype))
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...] * by
  return k(x)


@jax.custom_vjp
def _tripled(x):
  return _scale(x, 3.0)


_tripled.defvjp(lambda x: (_scale(x, 3.0), None), lambda _, g: (_scale(g, 3.0),),
                optimize_remat=True)


@pytest.mark.parametrize("remat", [False, True])
def test_custom_vjp_with_optimize_remat_differentiates_simulated_kernels(remat):
  x = jnp.arange(128, dtype=jnp.float32)
  f = jax.checkpoint(_tripled) if remat else _tripled
  with ps.backend("sim") as report:
    g = jax.jit(jax.grad(lambda x: (f(x) * x).sum()))(x)
  np.testing.assert_array_equal(np.asarray(g), 6 * np.asarray(x))
  assert len(report.kernels) >= 2  # forward (twice under remat) and backward
  # Outside a simulation JAX's own checks are as they were.
  from jax._src import callback, effects
  assert not effects.remat_allowed_effects.contains(callback._OrderedIOEffect)


LIBRARY_TESTS = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, pytest
    from jax.extend import backend
    from ragged_lib import ragged_rows

    def has_mosaic_gpu():
      d = backend.get_default_device()
      return d.platform == "gpu" and float(d.compute_capability) >= 9.0

    KIND = jax.devices()[0].device_kind  # (read at import, as tests do)
    pytestmark = pytest.mark.skipif(not has_mosaic_gpu(), reason="needs Mosaic GPU")

    def test_kind():
      assert KIND == "NVIDIA H200"

    def test_written_rows():
      x = jnp.arange(256 * 128, dtype=jnp.float32).reshape(256, 128)
      out = ragged_rows(x, jnp.array([128], jnp.int32))
      np.testing.assert_array_equal(np.asarray(out)[:128], np.asarray(x)[:128])
''')

DECLARATIONS = textwrap.dedent('''
    import numpy as np
    import pallas_sim as ps

    ps.leave_unwritten("ragged_rows", lambda x, n: {0: np.s_[int(n[0]):]})
''')


def test_a_librarys_own_tests_run_under_the_plugin(tmp_path):
  (tmp_path / "ragged_lib.py").write_text(RAGGED)
  (tmp_path / "test_lib.py").write_text(LIBRARY_TESTS)
  (tmp_path / "declarations.py").write_text(DECLARATIONS)
  env = dict(os.environ, PYTHONPATH=str(tmp_path))

  def pytest_(*args):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        *args, "test_lib.py"], cwd=tmp_path, capture_output=True,
                       text=True, env=env, timeout=300)
    return r.returncode, r.stdout + r.stderr

  rc, out = pytest_("--pallas-sim")
  assert rc == 0 and "2 skipped" in out, out
  rc, out = pytest_("--pallas-sim", "--pallas-sim-present-gpu", "--pallas-sim-gpu", "h200")
  assert rc == 1 and "1 failed, 1 passed" in out, out
  assert "UninitializedError" in out and "o_ref[128:256, 0:128]" in out
  rc, out = pytest_("--pallas-sim", "--pallas-sim-present-gpu", "--pallas-sim-gpu",
                    "h200", "-p", "declarations")
  assert rc == 0 and "2 passed" in out, out
  rc, out = pytest_("--pallas-sim-present-gpu")
  assert rc != 0 and "--pallas-sim-present-gpu needs --pallas-sim" in out
