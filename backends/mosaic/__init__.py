"""The real backend: runs kernels through JAX's Mosaic GPU lowering on a CUDA
device of compute capability 9.0 (H100/H200). A thin layer over plgpu."""
import jax

from pallas_sim.errors import BackendError
from pallas_sim.present import truly


def hopper_device():
  """The first CUDA device of compute capability 9.x, or None."""
  try:
    devices = jax.devices("gpu")
  except RuntimeError:
    return None
  for d in devices:
    cc = str(getattr(d, "compute_capability", ""))
    if cc.startswith("9"):
      return d
  return None


def describe_devices():
  out = []
  for d in jax.devices():
    cc = truly(d, "compute_capability")
    out.append(f"{truly(d, 'platform')}:{truly(d, 'device_kind')}"
               + (f" (sm {cc})" if cc else ""))
  return ", ".join(out)


def require_hopper():
  dev = hopper_device()
  if dev is None:
    raise BackendError(
        "backend='mosaic' runs kernels through the real Mosaic GPU lowering and "
        "needs a CUDA GPU of compute capability 9.0 (H100/H200) with "
        f"jax[cuda]; this machine has: {describe_devices()}. Use backend='sim' "
        "(or 'auto') to simulate instead.")
  return dev
