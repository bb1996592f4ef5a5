"""pytest plugin (registered by installing pallas-sim): the `gpu` marker
skips cleanly where no Hopper GPU is present."""
import pytest


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "gpu: needs a CUDA Hopper GPU (sm_90); skipped elsewhere")


def pytest_collection_modifyitems(config, items):
  from pallas_sim.backends import mosaic
  if mosaic.hopper_device() is not None:
    return
  skip = pytest.mark.skip(reason="needs a CUDA Hopper GPU (sm_90)")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)
