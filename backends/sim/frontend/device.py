"""What kernel code sees of the device at trace time, under the simulator.

JAX's production kernels read device properties while they are traced:
`backend.get_default_device().core_count` or `jax.devices()[0].core_count`
(hopper_matmul_mgpu, ragged dots: how many SMs a persistent grid has), and
`jax._src.lib.cuda_versions` (attention_mgpu: CUDA versions with known ptxas
bugs). On a CPU, a jax Device has no `core_count` and `cuda_versions` is
None. Inside a simulation they read the simulated GPU's values instead, with
nothing patched by the user; outside, everything is as it was. Where a real
GPU answers (a simulation on a GPU machine), its own values stay.
"""
import contextlib
import sys
import types
from collections.abc import Callable
from typing import Any

import jax

from pallas_sim.backends.sim.base import jax_internals as jx

# What the H200 machine's jax 0.11.2 CUDA plugin reports (its cuda_versions
# module, read there on 2026-11-30: benchmarks/HISTORY.md, "Device properties").
CUDA_VERSIONS = {
    "cuda_runtime_get_version": 13000, "cuda_runtime_build_version": 13000,
    "cuda_driver_get_version": 13000, "cuda_device_count": 1,
    "cudnn_get_version": 91900, "cudnn_build_version": 91200,
    "cublas_get_version": 130100, "cublas_build_version": 130000,
}
COMPUTE_CAPABILITY = 90  # sm_90: H100 and H200

_depth = [0]
_undo: list[Callable[[], Any]] = []


def _cuda_versions_module():
  mod = types.ModuleType("pallas_sim_cuda_versions",
                         "CUDA versions a simulated GPU reports (pallas-sim)")
  for name, value in CUDA_VERSIONS.items():
    setattr(mod, name, lambda value=value: value)
  setattr(mod, "cuda_compute_capability", lambda device=0: COMPUTE_CAPABILITY)
  return mod


def _patch():
  device_type = type(jax.devices()[0])
  if not hasattr(device_type, "core_count"):  # a CPU
    from pallas_sim.backends.sim.frontend import capture
    device_type.core_count = property(lambda self: capture.active_gpu().num_sms)
    _undo.append(lambda: delattr(device_type, "core_count"))
  if jx.lib.cuda_versions is None:
    fake = _cuda_versions_module()
    # Modules that imported the name before (from jax._src.lib import
    # cuda_versions) hold their own None: jax's own kernels.
    holders = [m for name, m in list(sys.modules.items())
               if name.startswith("jax") and m is not None
               and "cuda_versions" in getattr(m, "__dict__", {})
               and m.__dict__["cuda_versions"] is None]
    for m in holders:
      setattr(m, "cuda_versions", fake)

    def undo() -> None:
      for m in holders:
        setattr(m, "cuda_versions", None)
    _undo.append(undo)


@contextlib.contextmanager
def simulated():
  """Inside: device properties read at trace time are the simulated GPU's."""
  if _depth[0] == 0:
    _patch()
  _depth[0] += 1
  try:
    yield
  finally:
    _depth[0] -= 1
    if _depth[0] == 0:
      while _undo:
        _undo.pop()()
