"""tokamax (openxla/tokamax: the Pallas kernel library MaxText uses) as a
measuring stick: its sm90 Mosaic GPU kernels and its test files, run
unmodified in the simulator on a CPU, and natively on a Hopper GPU. Its
source is extracted from a fetched checkout at run time, never committed.

    # tokamax's source (a git checkout, bare or not), into build/tokamax/src
    ./dev python benchmarks/tokamax_suite.py extract --repo PATH [--rev REV]
    # a venv beside it with pallas-sim, the JAX of .venv and tokamax's needs
    ./dev python benchmarks/tokamax_suite.py setup
    # its kernels: outputs, race reports and times (--native: on the GPU)
    build/tokamax/venv/bin/python benchmarks/tokamax_suite.py kernels --out DIR [--native]
    # its test files under pytest --pallas-sim (--native: plain pytest on the GPU)
    build/tokamax/venv/bin/python benchmarks/tokamax_suite.py tests --out DIR [--native] [-k EXPR]
    # the two runs side by side
    ./dev python benchmarks/tokamax_suite.py compare NATIVE_DIR SIM_DIR

In the simulator its device dispatch sees an H200 (ps.present_gpu /
--pallas-sim-present-gpu), and the ragged dots' rows past the sum of the
group sizes, which their contract leaves unwritten, are declared with
ps.leave_unwritten (DECLARATIONS, loaded as a pytest plugin). Nothing of
tokamax is changed.
"""
import argparse
import json
import os
import subprocess
import sys
import time

# Each test's result as it comes, and a time limit per test: JAX's suite's
# own plugin (JAX_SUITE_LOG, JAX_SUITE_TEST_TIMEOUT).
from jax_suite import COMMON as SUITE_PLUGIN

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(ROOT, "build", "tokamax")  # (ignored by git)
SRC = os.path.join(WORK, "src")
VENV = os.path.join(WORK, "venv")

# tokamax's own dependencies (its pyproject) and its tests' (absltest, chex,
# flax), at versions seen to work with the window's JAX.
DEPENDENCIES = ["absl-py>=2.3", "einshape", "jaxtyping>=0.3", "pydantic>=2.11",
                "qwix>=0.1.2", "tqdm", "typeguard==2.13.3", "immutabledict",
                "tensorboardx", "xprof>=2.23.1", "chex>=0.1.91", "flax"]

TEST_FILES = ["tokamax/_src/ops/attention/pallas_mosaic_gpu_test.py",
              "tokamax/_src/ops/gated_linear_unit/pallas_mosaic_gpu_test.py",
              "tokamax/_src/ops/ragged_dot/pallas_mosaic_gpu_test.py"]

# What the ragged dots' contract leaves unwritten: the rows past the sum of
# the group sizes. Both sm90 kernels take their group info as
# (..., group_id, start_within_block, actual_size, block_start): the rows
# they write are the sum of actual_size.
DECLARATIONS = '''
import numpy as np
import pallas_sim as ps

for _name in ("ragged_dot_sm90", "ragged_dot_quant_sm90"):
  ps.leave_unwritten(_name, lambda *inputs: {0: np.s_[int(np.asarray(inputs[-2]).sum()):]})
'''

def extract(repo, rev):
  os.makedirs(SRC, exist_ok=True)
  archive = subprocess.run(["git", "-C", repo, "archive", rev], check=True,
                           capture_output=True).stdout
  subprocess.run(["tar", "-x", "-C", SRC], input=archive, check=True)
  head = subprocess.run(["git", "-C", repo, "log", "-1", "--format=%H %cd", rev],
                        capture_output=True, text=True, check=True).stdout.strip()
  with open(os.path.join(WORK, "REVISION"), "w") as f:
    f.write(head + "\n")
  print(f"tokamax {head} -> {SRC}")


def setup():
  import jax
  import jaxlib
  if not os.path.exists(os.path.join(VENV, "bin", "python")):
    subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
  pip = [os.path.join(VENV, "bin", "python"), "-m", "pip", "install", "-q"]
  subprocess.run(pip + ["-e", f"{ROOT}[test]", f"jax=={jax.__version__}",
                        f"jaxlib=={jaxlib.__version__}", *DEPENDENCIES], check=True)
  print(f"{VENV}: pallas-sim, jax {jax.__version__} and tokamax's dependencies")


# --- the kernels ------------------------------------------------------------

def _rng_array(rng, shape, dtype, scale=1.0):
  import jax.numpy as jnp
  return jnp.asarray((rng.standard_normal(shape) * scale).astype("float32"), dtype)


def cases():
  """(name, family, fn() -> (outputs dict)); inputs from a seeded numpy
  generator, the same on every machine."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import qwix
  from tokamax._src.ops.attention import pallas_mosaic_gpu as fa
  from tokamax._src.ops.gated_linear_unit import pallas_mosaic_gpu as glu
  from tokamax._src.ops.ragged_dot import pallas_mosaic_gpu as rd

  out = []

  def attention(name, *, d=64, t=512, h=2, causal=False, persistent=False,
                block_q=64, block_kv=64, grad=False):
    def run():
      rng = np.random.default_rng(len(name))
      q, k, v = (_rng_array(rng, (1, t, h, d), jnp.bfloat16) for _ in range(3))
      op = fa.PallasMosaicGpuFlashAttention().replace(config=fa.ConfigSM90(
          block_q=block_q, block_kv=block_kv, num_stages=2, persistent=persistent))
      f = lambda q, k, v: op(q, k, v, is_causal=causal)
      if not grad:
        return {"out": f(q, k, v)}
      o, vjp = jax.vjp(f, q, k, v)
      dq, dk, dv = vjp(_rng_array(rng, o.shape, o.dtype))
      return {"out": o, "dq": dq, "dk": dk, "dv": dv}
    out.append((name, "attention", run))

  attention("attention d64")
  attention("attention d128 causal", d=128, causal=True)
  attention("attention d64 causal persistent", causal=True, persistent=True)
  attention("attention d128 block_q128", d=128, block_q=128, block_kv=128, t=1024)
  attention("attention backward d64", grad=True, t=256)
  attention("attention backward d128 causal", d=128, causal=True, grad=True, t=256)

  def gated(name, m=256, n=256, k=128, activation=jax.nn.swish):
    def run():
      rng = np.random.default_rng(len(name))
      x = _rng_array(rng, (m, k), jnp.bfloat16)
      w = _rng_array(rng, (k, 2, n), jnp.bfloat16, 0.1)
      return {"out": glu.PallasMosaicGpuGatedLinearUnit()(x, w, activation=activation)}
    out.append((name, "gated linear unit", run))

  gated("glu swish")
  gated("glu sigmoid 512x512x256", 512, 512, 256, jax.nn.sigmoid)

  def ragged(name, *, g=8, m=1024, k=256, n=256, persistent=False, padded=False,
             out_type=None, quant=None, grad=False, block_k=256, xla=False):
    def run():
      rng = np.random.default_rng(len(name))
      a = _rng_array(rng, (m, k), jnp.bfloat16, 0.1)
      b = _rng_array(rng, (g, k, n), jnp.bfloat16, 0.1)
      sizes = (rng.integers(0, m // g, g) if padded else np.full(g, m // g))
      sizes = jnp.asarray(sizes, jnp.int32)
      if quant:
        b = qwix.quantize(b, quant, tiled_axes={0: 1, 1: k, 2: 1})
      op = rd.PallasMosaicGpuRaggedDot().replace(config=rd.Config(
          block_m=128, block_n=64, block_k=block_k, num_stages=2, split_k=1,
          persistent=persistent))
      kw = {} if out_type is None else {"preferred_element_type": out_type}
      f = lambda a, b: op(a, b, group_sizes=sizes, **kw)
      count = int(np.asarray(sizes).sum())
      if xla:  # (XLA's own op, on the machine's backend: the tests' reference)
        ref = jax.lax.ragged_dot(a, b, sizes, preferred_element_type=jnp.float32)
        return {"out": f(a, b)[:count], "xla_ragged_dot": ref[:count]}
      if not grad:
        return {"out": f(a, b)[:count]}
      o, vjp = jax.vjp(f, a, b)
      da, db = vjp(_rng_array(rng, o.shape, o.dtype))
      return {"out": o[:count], "d_lhs": da[:count], "d_rhs": db}
    out.append((name, "ragged dot", run))

  ragged("ragged dot")
  ragged("ragged dot persistent", persistent=True)
  ragged("ragged dot padded groups", padded=True)
  ragged("ragged dot f32 out", out_type=jnp.float32, xla=True)
  ragged("ragged dot and its gradient (contracting dimension)", grad=True, k=128,
         block_k=128)
  ragged("ragged dot int8 weights", quant=jnp.int8)
  ragged("ragged dot int4 weights", quant=jnp.int4)
  return out


def _xprof_stand_in():
  """tokamax's benchmarking module imports xprof (for its autotuner's
  profiles, which nothing here runs). Where xprof is not installed (the GPU
  machine: its wheel is 100 MB), a stand-in module that raises if called is
  put on the path; returns its folder, or None."""
  try:
    import xprof  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    return None
  except ImportError:
    pass
  folder = os.path.join(WORK, "stand_ins")
  tools = os.path.join(folder, "xprof", "cli")
  os.makedirs(tools, exist_ok=True)
  for init in (os.path.join(folder, "xprof", "__init__.py"),
               os.path.join(tools, "__init__.py")):
    open(init, "a").close()
  with open(os.path.join(tools, "tools.py"), "w") as f:
    f.write("def get_kernel_stats_tool(*args, **kwargs):\n"
            "  raise NotImplementedError('xprof is not installed (a stand-in)')\n")
  sys.path.append(folder)
  return folder


def kernels(out_dir, native, only):
  import jax
  import numpy as np
  os.makedirs(out_dir, exist_ok=True)
  _xprof_stand_in()
  results = {}
  if not native:
    import pallas_sim as ps
    presenting = ps.present_gpu("h200")
    presenting.__enter__()
    exec(DECLARATIONS, {})  # pylint: disable=exec-used
  sys.path.insert(0, SRC)
  for name, family, run in cases():
    if only and only not in name:
      continue
    row = {"family": family}
    t0 = time.time()
    try:
      if native:
        outs = jax.block_until_ready(run())
        row["wall_s"] = round(time.time() - t0, 3)
      else:
        with ps.backend("sim", gpu="h200", on_race="report",
                        on_uninitialized="report") as report:
          outs = jax.block_until_ready(run())
        row["wall_s"] = round(time.time() - t0, 3)
        row["kernels"] = [k.name for k in report.kernels]
        row["predicted_us"] = round(sum(k.time_s for k in report.kernels) * 1e6, 2)
        row["races"] = [str(r).splitlines()[0] for r in report.races]
        row["race_texts"] = [str(r) for r in report.races]
        row["uninitialized"] = [str(f).splitlines()[0] for f in report.uninitialized]
      np.savez(os.path.join(out_dir, _file(name)),
               **{k: np.asarray(v).astype(np.float32) for k, v in outs.items()})
      row["ok"] = True
    except Exception as e:  # (recorded: one case's failure is a row of the table)
      row["ok"] = False
      row["error"] = f"{type(e).__name__}: {str(e)[:600]}"
    results[name] = row
    print(f"{name}: {'ok' if row['ok'] else row['error'][:200]} ({time.time() - t0:.1f} s)",
          flush=True)
    with open(os.path.join(out_dir, "kernels.json"), "w") as f:
      json.dump(results, f, indent=1)
  if not any(r["ok"] for r in results.values()):
    sys.exit("no kernel case ran")


def _file(name):
  return name.replace(" ", "_").replace("(", "").replace(")", "") + ".npz"


# --- the test files -----------------------------------------------------------

def tests(out_dir, native, expr, files, timeout, n):
  os.makedirs(out_dir, exist_ok=True)
  plugins = os.path.join(WORK, "plugins")
  os.makedirs(plugins, exist_ok=True)
  with open(os.path.join(plugins, "tokamax_suite_conftest.py"), "w") as f:
    f.write(SUITE_PLUGIN)
  with open(os.path.join(plugins, "tokamax_declarations.py"), "w") as f:
    f.write(DECLARATIONS)
  log = os.path.abspath(os.path.join(out_dir, "tests.jsonl"))
  if os.path.exists(log):
    os.remove(log)
  path = [plugins, SRC, os.environ.get("PYTHONPATH", ""), _xprof_stand_in() or ""]
  env = dict(os.environ, JAX_SUITE_LOG=log, JAX_SUITE_TEST_TIMEOUT=str(timeout),
             PYTHONPATH=os.pathsep.join(p for p in path if p))
  args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
          "tokamax_suite_conftest", "-W", "ignore::DeprecationWarning", "-rN"]
  if not native:
    args += ["--pallas-sim", "--pallas-sim-present-gpu", "--pallas-sim-gpu", "h200",
             "-p", "tokamax_declarations"]
  if expr:
    args += ["-k", expr]
  if n:
    args += ["-n", str(n)]
  args += files or TEST_FILES
  t0 = time.time()
  r = subprocess.run(args, cwd=SRC, env=env)
  rows = _read_log(log)
  counts = {}
  for row in rows:
    counts[row[1]] = counts.get(row[1], 0) + 1
  summary = {"counts": counts, "wall_s": round(time.time() - t0, 1),
             "returncode": r.returncode, "native": native}
  with open(os.path.join(out_dir, "tests_summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  print(summary)
  if not rows:
    sys.exit("no test ran")


def _read_log(path):
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


# --- side by side ------------------------------------------------------------

def _ulps(a, b):
  """Largest distance in units in the last place of the arrays' own type:
    bfloat16 where every value is one (the cases save outputs as float32),
    else float32; (distance, type name)."""
  import numpy as np
  ia, ib = (np.asarray(x, np.float32).view(np.int32).astype(np.int64) for x in (a, b))
  bf16 = not ((ia | ib) & 0xFFFF).any()
  ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
  ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
  d = int(np.abs(ia - ib).max()) if ia.size else 0
  return (d >> 16, "bf16") if bf16 else (d, "f32")


def compare(native_dir, sim_dir):
  """The kernels' table where both folders hold a kernels run, the tests'
  where both hold a tests run."""
  if all(os.path.exists(os.path.join(d, "kernels.json")) for d in (native_dir, sim_dir)):
    _compare_kernels(native_dir, sim_dir)
  nt, st = (os.path.join(d, "tests.jsonl") for d in (native_dir, sim_dir))
  if os.path.exists(nt) and os.path.exists(st):
    _compare_tests(nt, st)


def _compare_kernels(native_dir, sim_dir):
  import numpy as np
  nat = json.load(open(os.path.join(native_dir, "kernels.json")))
  sim = json.load(open(os.path.join(sim_dir, "kernels.json")))
  print("| case | family | outputs equal, bit for bit | largest difference | "
        "races (sim) |")
  print("|---|---|---|---|---|")
  for name, s in sim.items():
    n = nat.get(name)
    if n is None or not (n["ok"] and s["ok"]):
      why = (s.get("error") or (n or {}).get("error") or "not run natively")
      print(f"| {name} | {s['family']} | - | {why[:80]} | |")
      continue
    a = np.load(os.path.join(native_dir, _file(name)))
    b = np.load(os.path.join(sim_dir, _file(name)))
    equal = all(np.array_equal(a[k], b[k], equal_nan=True) for k in a.files)
    diffs = []
    for k in a.files:
      if not np.array_equal(a[k], b[k], equal_nan=True):
        scale = float(np.abs(a[k]).max()) or 1.0
        d, kind = _ulps(a[k], b[k])
        share = np.mean(a[k] != b[k])
        diffs.append(f"{k}: {float(np.abs(a[k] - b[k]).max()) / scale:.1e} of its "
                     f"largest, {d} {kind} ulp at most, {share:.2%} of elements")
    print(f"| {name} | {s['family']} | {'yes' if equal else 'no'} | "
          f"{'; '.join(diffs) or '-'} | {len(s.get('races', []))} |")


def _compare_tests(native_log, sim_log):
  native_rows = {r[0]: r for r in _read_log(native_log)}
  sim_rows = {r[0]: r for r in _read_log(sim_log)}
  table = {}
  for test, row in native_rows.items():
    s = sim_rows.get(test)
    key = (row[1], s[1] if s else "not run")
    table.setdefault(key, []).append(test)
  print("\n| natively | in the simulator | tests |")
  print("|---|---|---|")
  for (a, b), names in sorted(table.items()):
    print(f"| {a} | {b} | {len(names)} |")
  for test, row in sim_rows.items():
    n = native_rows.get(test)
    if n and n[1] == "passed" and row[1] != "passed":
      print(f"  {test}: {row[1]}: {row[2][:200]}")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = p.add_subparsers(dest="cmd", required=True)
  e = sub.add_parser("extract")
  e.add_argument("--repo", required=True)
  e.add_argument("--rev", default="HEAD")
  sub.add_parser("setup")
  k = sub.add_parser("kernels")
  k.add_argument("--out", required=True)
  k.add_argument("--native", action="store_true")
  k.add_argument("--only", default="")
  t = sub.add_parser("tests")
  t.add_argument("--out", required=True)
  t.add_argument("--native", action="store_true")
  t.add_argument("-k", dest="expr", default="")
  t.add_argument("-n", type=int, default=0)
  t.add_argument("--timeout", type=int, default=600, help="seconds a test")
  t.add_argument("files", nargs="*")
  c = sub.add_parser("compare")
  c.add_argument("native")
  c.add_argument("sim")
  a = p.parse_args(argv)
  if a.cmd == "extract":
    extract(a.repo, a.rev)
  elif a.cmd == "setup":
    setup()
  elif a.cmd == "kernels":
    kernels(a.out, a.native, a.only)
  elif a.cmd == "tests":
    tests(a.out, a.native, a.expr, a.files, a.timeout, a.n)
  else:
    compare(a.native, a.sim)


if __name__ == "__main__":
  main()
