"""The public API and the stages' seams are annotated and type-checked
(mypy, configured in pyproject.toml: strict for the seams, the rest's
bodies checked as they are)."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _installed_layout(tmp):
  """The package as it installs (backends/ as pallas_sim/backends), made of
  links to the checkout: mypy follows no import hook, so the editable
  install's mapping of backends/ is laid out for it."""
  pkg = os.path.join(tmp, "pallas_sim")
  os.makedirs(pkg)
  for name in os.listdir(os.path.join(ROOT, "pallas_sim")):
    if name != "__pycache__":
      os.symlink(os.path.join(ROOT, "pallas_sim", name), os.path.join(pkg, name))
  os.symlink(os.path.join(ROOT, "backends"), os.path.join(pkg, "backends"))
  return pkg


def test_the_api_and_the_seams_type_check(tmp_path):
  pytest.importorskip("mypy")
  _installed_layout(str(tmp_path))
  cache = os.path.join(ROOT, "build", "mypy-cache")
  p = subprocess.run(
      [sys.executable, "-m", "mypy", "--config-file", os.path.join(ROOT, "pyproject.toml"),
       "--cache-dir", cache, "-p", "pallas_sim"],
      cwd=tmp_path, capture_output=True, text=True, timeout=600)
  # (its paths name the links: name the checkout's files)
  out = re.sub(r"^pallas_sim/backends/", "backends/", p.stdout, flags=re.M)
  assert p.returncode == 0, out + p.stderr
