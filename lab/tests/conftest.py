"""Fixtures the lab's device-step tests share."""
import os

import pytest


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
  """A stand-in nvidia-smi on the PATH that reports an SM clock: call it
  with the clock (MHz) the device steps should read."""
  def install(mhz=1980):
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir(exist_ok=True)
    smi.write_text(f"#!/bin/sh\necho {mhz}\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
  return install
