"""`present_gpu`: device queries see a Hopper GPU while kernels run in the
simulator, for kernel libraries that pick their Mosaic GPU kernels by the
device (tokamax: has_mosaic_gpu_support(), is_sm90(); tests that read
device_kind). `pytest --pallas-sim --pallas-sim-present-gpu` keeps it on for
a whole test session, so that what a library decides at import and
collection time sees the GPU too.
"""
import contextlib
from typing import Any

import jax

from pallas_sim import gpus

# The Device properties present_gpu overrides, and what it shows: sm_90.
_PRESENTED = ("platform", "device_kind", "compute_capability", "core_count")
COMPUTE_CAPABILITY = "9.0"
# the device type's own properties (None: it had none), while presenting
_presenting: list[dict[str, Any]] = []


@contextlib.contextmanager
def present_gpu(gpu="h100"):
  """Inside, every CPU device says platform "gpu", the model's device_kind
  ("NVIDIA H200"...), compute capability "9.0" and its SM count, and
  jax.default_backend() says "gpu". JAX itself dispatches by its backends,
  not by these properties: computations still run on the CPU, and kernels
  run simulated inside ps.backend("sim") (or under the pytest plugin).
  Where a real GPU answers, or inside another present_gpu, nothing changes."""
  gpu = gpus.get(gpu)
  device_type = type(jax.devices()[0])
  if jax.default_backend() != "cpu" or _presenting:
    yield
    return
  saved = {n: device_type.__dict__.get(n) for n in _PRESENTED}
  values = {"platform": "gpu", "device_kind": gpu.device_kind,
            "compute_capability": COMPUTE_CAPABILITY, "core_count": gpu.num_sms}
  for name, value in values.items():
    setattr(device_type, name, _constant(value))
  default_backend = jax.default_backend
  jax.default_backend = lambda: "gpu"
  _presenting.append(saved)
  try:
    yield
  finally:
    _presenting.pop()
    jax.default_backend = default_backend
    for name, prop in saved.items():
      if prop is None:
        delattr(device_type, name)
      else:
        setattr(device_type, name, prop)


def _constant(value: object) -> property:
  """A read-only property whose value is `value`."""
  return property(lambda self: value)


def truly(device, name):
  """A device property as the device itself reports it (None where it has
  none), whatever present_gpu shows."""
  if _presenting and name in _PRESENTED:
    prop = _presenting[-1][name]
    return None if prop is None else prop.__get__(device)
  return getattr(device, name, None)
