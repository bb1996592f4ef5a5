"""Whether a wgmma's register operand survives the next loop step on this
GPU: int8 weights upcast in registers (WGMMA_UPCAST_2X) and multiplied as
wgmma's A operand against an SMEM tile, one K step a loop iteration, each
step ending in wgmma_wait(n). With n=1 the wgmma of step i may still read
its A registers while step i+1 loads and converts the next weights, which the
loop keeps in the same registers: the PTX ISA calls touching them before the
wait that retires the wgmma undefined, and ptxas may serialize the wgmmas
instead (its C75xx notes). A kernel library (pallasforge's W8A16 matmul)
reports wrong numbers with wgmma_wait(1) there, unexplained.

Each case's error against the exact product and its time (median of
repeated calls), on the GPU (default) or in the simulator (--sim), into
OUT/register_operand.json; on the GPU each case also compiles once more in a
process of its own with ptxas's verbose output on (MOSAIC_GPU_DUMP_PTXAS),
whose wgmma serialization notes go beside it.

    python3 -m lab.register_operand_probe --out DIR [--sim]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import mosaic_gpu as plgpu

N, TK = 64, 128  # the weights' rows (wgmma's M), and a K step

ROUNDS = 128  # times over the K steps: a kernel long enough to time per call

# (name, activation rows M, K steps, wgmma_wait, the loop's unroll factor)
CASES = [
    ("m8 wait1", 8, 8, 1, 1),
    ("m8 wait0", 8, 8, 0, 1),
    ("m64 wait1", 64, 8, 1, 1),
    ("m64 wait0", 64, 8, 0, 1),
    ("m64 wait1 unroll2", 64, 8, 1, 2),
]


def kernel(m, steps, wait_n, unroll, rounds=None):
  """o (N, M) = rounds * w (N, steps*TK) @ x (M, steps*TK).T, the weights
  upcast in registers each step; w and x are handed in as (steps, rows, TK)."""
  rounds = ROUNDS if rounds is None else rounds
  def swz(tile):
    return dict(transforms=(plgpu.TilingTransform(tile), plgpu.SwizzleTransform(128)))

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((N, m), jnp.float32),
                scratch_types=dict(w_s=plgpu.SMEM((steps, N, TK), jnp.int8, **swz((8, 128))),
                                   x_s=plgpu.SMEM((steps, m, TK), jnp.bfloat16, **swz((8, 64))),
                                   bar=plgpu.Barrier(num_arrivals=2),
                                   acc=plgpu.ACC((N, m), jnp.float32)))
  def k(w_ref, x_ref, o_ref, w_s, x_s, bar, acc):
    plgpu.copy_gmem_to_smem(w_ref, w_s, bar)
    plgpu.copy_gmem_to_smem(x_ref, x_s, bar)
    plgpu.barrier_wait(bar)

    def step(i, carry):
      s = jax.lax.rem(i, steps)
      w = plgpu.load(w_s.at[s], layout=plgpu.Layout.WGMMA_UPCAST_2X)
      w = plgpu.layout_cast(w, plgpu.Layout.WGMMA).astype(jnp.bfloat16)
      plgpu.wgmma(acc, w, x_s.at[s].T)
      plgpu.wgmma_wait(wait_n)
      return carry
    jax.lax.fori_loop(0, rounds * steps, step, 0, unroll=unroll)
    o_ref[...] = acc[...]
  return k


def inputs(m, steps, seed=0, rounds=None):
  rounds = ROUNDS if rounds is None else rounds
  r = np.random.default_rng(seed)
  w = r.integers(-127, 128, (steps, N, TK)).astype(np.int8)
  x = r.standard_normal((steps, m, TK)).astype(jnp.bfloat16)
  want = rounds * np.einsum("snk,smk->nm", w.astype(np.float64), x.astype(np.float64))
  return jnp.asarray(w), jnp.asarray(x), want


def run_case(case, sim, repeat=50):
  import pallas_sim as ps
  name, m, steps, wait_n, unroll = case
  w, x, want = inputs(m, steps)
  fn = kernel(m, steps, wait_n, unroll)
  row = {"name": name, "m": m, "steps": steps, "rounds": ROUNDS, "wait": wait_n,
         "unroll": unroll}
  if sim:
    s = ps.simulate(fn, w, x, gpu="h200", on_race="report")
    got = np.asarray(s.outputs, np.float64)
    row["predicted_us"] = s.report.kernels[0].time_s * 1e6
    row["races"] = [str(r).splitlines()[0] for r in s.report.races]
  else:
    f = jax.jit(fn)
    got = np.asarray(f(w, x), np.float64)
    times = []
    for _ in range(repeat):
      t = time.perf_counter()
      jax.block_until_ready(f(w, x))
      times.append(time.perf_counter() - t)
    row["call_us_median"] = float(np.median(times) * 1e6)
  err = np.abs(got - want)
  row["max_rel_err"] = float(err.max() / np.abs(want).max())
  # (a wrong step's weights give errors of the product's own size)
  row["wrong_elements"] = int((err > 1e-3 * np.abs(want).max()).sum())
  return row


def ptxas_versions():
  """Every ptxas this machine holds (the PATH's, CUDA's, the nvidia wheels'),
  with its version line: NVIDIA's CUDA 13.3 release notes fix a ptxas that
  reused a wgmma's input registers before the wgmma had read them."""
  import glob
  import shutil
  found = {shutil.which("ptxas"), *glob.glob("/usr/local/cuda*/bin/ptxas")}
  try:
    import nvidia
    for root in nvidia.__path__:
      found.update(glob.glob(os.path.join(root, "**", "ptxas"), recursive=True))
  except ImportError:
    pass
  out = {}
  for path in sorted(p for p in found if p):
    try:
      v = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
      out[path] = (v.stdout.strip().splitlines() or ["?"])[-1]
    except (OSError, subprocess.SubprocessError) as e:
      out[path] = f"{type(e).__name__}"
  return out


_SERIAL = re.compile(r"\(C75\d\d\)[^\n]*serializ[^\n]*")


def ptxas_notes(name):
  """ptxas's wgmma serialization notes for one case, compiled in a process
  of its own with the dump switch set before jax loads."""
  env = dict(os.environ, MOSAIC_GPU_DUMP_PTXAS="1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
  p = subprocess.run([sys.executable, "-m", "lab.register_operand_probe", "--child", name],
                     capture_output=True, text=True, env=env, timeout=120,
                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  text = p.stdout + p.stderr
  return sorted({re.sub(r"'[^']*'", "'...'", n) for n in _SERIAL.findall(text)}), p.returncode


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", default=os.environ.get("OUT", "."))
  ap.add_argument("--sim", action="store_true", help="in the simulator, on this machine")
  ap.add_argument("--child", help=argparse.SUPPRESS)
  a = ap.parse_args(argv)
  if a.child:
    case = next(c for c in CASES if c[0] == a.child)
    w, x, _ = inputs(*case[1:3])
    jax.block_until_ready(jax.jit(kernel(*case[1:]))(w, x))
    return 0
  if not a.sim and jax.default_backend() != "gpu":
    sys.exit("no GPU here: run with --sim for the simulator")
  os.makedirs(a.out, exist_ok=True)
  toolchain = {} if a.sim else ptxas_versions()
  print("ptxas:", json.dumps(toolchain), flush=True)
  rows = []
  for case in CASES:
    row = run_case(case, a.sim)
    if not a.sim:
      row["ptxas_serialization"], row["ptxas_rc"] = ptxas_notes(case[0])
    rows.append(row)
    print(json.dumps(row), flush=True)
    with open(os.path.join(a.out, "register_operand.json"), "w") as f:
      json.dump({"command": " ".join(["python3 -m lab.register_operand_probe"] + (argv or sys.argv[1:])),
                 "backend": "sim" if a.sim else jax.devices()[0].device_kind,
                 "jax": jax.__version__, "ptxas": toolchain, "rows": rows}, f, indent=1)
  if len(rows) != len(CASES):
    sys.exit("not every case ran")
  return 0


if __name__ == "__main__":
  sys.exit(main())
