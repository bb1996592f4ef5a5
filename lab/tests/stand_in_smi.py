"""A stand-in nvidia-smi for the lab's device-step tests (a module of its
own: a second conftest.py beside tests/' would shadow that one)."""
import os


def install(tmp_path, monkeypatch, mhz=1980):
  """Puts an nvidia-smi on the PATH that reports `mhz` as the SM clock."""
  smi = tmp_path / "bin" / "nvidia-smi"
  smi.parent.mkdir(exist_ok=True)
  smi.write_text(f"#!/bin/sh\necho {mhz}\n")
  smi.chmod(0o755)
  monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
