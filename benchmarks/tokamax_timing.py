"""tokamax's sm90 kernels timed at working sizes: kernels nobody tuned the
timing model on (benchmarks/tokamax_suite.py runs them for their bits; this
for their time). Each case is one tokamax op, jitted, on random inputs.

    # on the GPU machine (build/tokamax/src and its wheels carried: lab/library_plan.sh)
    python3 benchmarks/tokamax_timing.py measure --out DIR
    # on a CPU, in the tokamax venv (tokamax_suite.py setup): the model's times, at
    # its own clock (a blind set: committed before the GPU's), or at each row's
    # clock on the GPU
    build/tokamax/venv/bin/python benchmarks/tokamax_timing.py predict --out FILE \
        [--at DIR/tokamax_timing.json]
    # the two side by side
    ./dev python benchmarks/tokamax_timing.py compare DIR/tokamax_timing.json FILE

On the GPU a case is timed as lab/measure_gpu.py times a suite row (a
second of calls first, then the median of seven batches), its SM clock
sampled by nvidia-smi over the batches. Its time is the jitted op's, the
XLA work around the kernels included; the model's is its kernels' alone,
and each case lists the kernels it launches so a case with other work says
so (`kernels` in the table).
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]
import tokamax_suite  # noqa: E402  (the checkout's paths, its stand-ins)

SMALL = [False]  # (--small: each case at a size the simulator runs in seconds)
_PRESENTED = []


def cases():
  """(name, build) pairs; build() -> (fn, args) with args as arrays of the
  case's shapes (random normal values, a seeded generator), group sizes
  as they are."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import qwix
  from tokamax._src.ops.attention import pallas_mosaic_gpu as fa
  from tokamax._src.ops.gated_linear_unit import pallas_mosaic_gpu as glu
  from tokamax._src.ops.ragged_dot import pallas_mosaic_gpu as rd
  small = SMALL[0]
  arr = tokamax_suite._rng_array
  out = []

  def attention(name, *, t, h, d, block_q, block_kv, causal=False, persistent=False):
    t, h = (512, 2) if small else (t, h)

    def build():
      rng = np.random.default_rng(len(name))
      q, k, v = (arr(rng, (1, t, h, d), jnp.bfloat16) for _ in range(3))
      op = fa.PallasMosaicGpuFlashAttention().replace(config=fa.ConfigSM90(
          block_q=block_q, block_kv=block_kv, num_stages=2, persistent=persistent))
      return (lambda q, k, v: op(q, k, v, is_causal=causal)), (q, k, v)
    out.append((f"attention s{t} h{h} d{d} bq{block_q} bkv{block_kv}"
                + (" causal" if causal else "") + (" persistent" if persistent else ""),
                build))

  attention("a", t=4096, h=16, d=128, block_q=64, block_kv=128)
  attention("b", t=4096, h=16, d=128, block_q=64, block_kv=128, causal=True)
  attention("c", t=4096, h=16, d=128, block_q=64, block_kv=64)
  attention("d", t=8192, h=8, d=64, block_q=64, block_kv=128)
  attention("e", t=4096, h=16, d=128, block_q=64, block_kv=128, causal=True,
            persistent=True)

  def gated(m, k, n, activation, act_name):
    m, k, n = (256, 256, 256) if small else (m, k, n)

    def build():
      rng = np.random.default_rng(m + k + n)
      x = arr(rng, (m, k), jnp.bfloat16)
      w = arr(rng, (k, 2, n), jnp.bfloat16, 0.1)
      op = glu.PallasMosaicGpuGatedLinearUnit()
      return (lambda x, w: op(x, w, activation=activation)), (x, w)
    out.append((f"glu {act_name} {m}x{k}x{n}", build))

  gated(4096, 4096, 4096, jax.nn.swish, "swish")
  gated(8192, 2048, 4096, jax.nn.sigmoid, "sigmoid")

  def ragged(*, g, m, k, n, quant=None, persistent=False):
    m, k, n = (1024, 256, 256) if small else (m, k, n)

    def build():
      rng = np.random.default_rng(g + m + k + n)
      a = arr(rng, (m, k), jnp.bfloat16, 0.1)
      b = arr(rng, (g, k, n), jnp.bfloat16, 0.1)
      if quant:
        b = qwix.quantize(b, quant, tiled_axes={0: 1, 1: k, 2: 1})
      sizes = jnp.asarray(np.full(g, m // g), jnp.int32)
      # (quantized weights take an output swizzle as wide as block_n: 64)
      blocks = dict(block_n=64, block_k=256, num_stages=2) if quant else dict(
          block_n=128, block_k=64, num_stages=4)
      op = rd.PallasMosaicGpuRaggedDot().replace(config=rd.Config(
          block_m=128, split_k=1, persistent=persistent, **blocks))
      return (lambda a, b, sizes: op(a, b, group_sizes=sizes)), (a, b, sizes)
    out.append((f"ragged dot g{g} {m}x{k}x{n}" + (f" {jnp.dtype(quant).name} weights"
                                                  if quant else "")
                + (" persistent" if persistent else ""), build))

  ragged(g=8, m=8192, k=4096, n=4096)
  ragged(g=8, m=8192, k=4096, n=4096, persistent=True)
  ragged(g=16, m=16384, k=2048, n=2048)
  ragged(g=8, m=8192, k=4096, n=4096, quant=jnp.int8)
  return out


def _setup(sim):
  tokamax_suite._xprof_stand_in()
  sys.path.insert(0, tokamax_suite.SRC)
  if sim:  # (held for the process: a dropped context manager would undo it)
    import pallas_sim as ps
    _PRESENTED.append(ps.present_gpu("h200"))
    _PRESENTED[-1].__enter__()


def measure(out_dir, only="", sustain_s=1.0, batch_s=0.1, sim=False):
  """Each case natively: compiled, run once, timed; DIR/tokamax_timing.json
  after every case. Exits 1 where no case was timed. `sim`: every call in
  the simulator instead (a CPU's run of the GPU step, end to end)."""
  import contextlib
  from lab import measure_gpu
  _setup(sim=sim)
  os.makedirs(out_dir, exist_ok=True)
  measure_gpu.SUSTAIN_S[0] = sustain_s
  clocks = measure_gpu.ClockSampler()
  rows = []
  if sim:
    import pallas_sim as ps
    exec(tokamax_suite.DECLARATIONS, {})  # pylint: disable=exec-used
  with (ps.backend("sim", gpu="h200", check_races=False) if sim
        else contextlib.nullcontext()):
    _measure_cases(out_dir, only, batch_s, clocks, rows)
  if not any("median_s" in r for r in rows):
    sys.exit("no case timed")


def _measure_cases(out_dir, only, batch_s, clocks, rows):
  import jax
  from lab import measure_gpu
  try:
    for name, build in cases():
      if only not in name:
        continue
      row = {"name": name}
      t0 = time.time()
      try:
        fn, args = build()
        f = jax.jit(fn)
        jax.block_until_ready(f(*args))
        row["first_call_s"] = round(time.time() - t0, 3)
        t1 = time.time()
        row.update(measure_gpu.time_fn(f, args, batch_s=batch_s))
        row["clock"] = clocks.window(t1, time.time())
        row["kernels"] = _kernel_names(fn, args)
      except Exception as e:  # (a case's failure is a row of the table)
        row["error"] = f"{type(e).__name__}: {e}"[:800]
      rows.append(row)
      print(f"{name}: " + (f"{row['median_s'] * 1e6:.1f} us at "
                           f"{(row.get('clock') or {}).get('sm_mhz')} MHz"
                           if "median_s" in row else row["error"][:200])
            + f" ({time.time() - t0:.1f} s)", flush=True)
      with open(os.path.join(out_dir, "tokamax_timing.json"), "w") as fh:
        json.dump({"command": " ".join(sys.argv), "revision": _revision(),
                   "env": measure_gpu._env(), "rows": rows}, fh, indent=1)
  finally:
    clocks.stop()


def _kernel_names(fn, args):
  """The kernels fn launches (pallas_call, or plgpu.kernel's mpmd_map), by
  name, in order, from its jaxpr (not looking inside a kernel)."""
  import jax
  from pallas_sim.backends.sim.analysis import walker
  from pallas_sim.backends.sim.base import jax_internals as jx
  names = []

  def visit(j):
    for e in j.eqns:
      if e.primitive is jx.pallas_call.pallas_call_p:
        names.append(getattr(e.params.get("name_and_src_info"), "name", "pallas_call"))
      elif e.primitive is jx.mpmd.mpmd_map_p:
        names.append(e.params.get("name") or "kernel")
      else:
        for b in walker.bodies(e):
          visit(b)
  visit(jax.make_jaxpr(fn)(*args).jaxpr)
  return names


def _revision():
  path = os.path.join(tokamax_suite.WORK, "REVISION")
  return open(path).read().strip() if os.path.exists(path) else None


def predict(out, at=None, only=""):
  """Each case's estimate on a CPU: at the model's own clock, or at each
  row's clock in `at` (a measure run's tokamax_timing.json)."""
  import jax
  import pallas_sim as ps
  _setup(sim=True)
  exec(tokamax_suite.DECLARATIONS, {})  # pylint: disable=exec-used
  clock = {}
  if at:
    clock = {r["name"]: (r.get("clock") or {}).get("sm_mhz")
             for r in json.load(open(at))["rows"]}
  rows = []
  for name, build in cases():
    if only not in name:
      continue
    t0 = time.time()
    row = {"name": name}
    try:
      fn, args = build()
      # (large operands as shapes; the group sizes, which set the paths, as they are)
      shaped = jax.tree.map(
          lambda a: a if a.size <= 64 else jax.ShapeDtypeStruct(a.shape, a.dtype), args)
      mhz = clock.get(name)
      r = ps.estimate(fn, *shaped, gpu="h200", **({"clock_mhz": mhz} if mhz else {}))
      row.update(predicted_s=sum(k.time_s for k in r.kernels),
                 kernels=[k.name for k in r.kernels],
                 mhz=mhz or (r.kernels[0].sm_mhz if r.kernels else None),
                 classes=[k.classes for k in r.kernels], estimate_s=time.time() - t0)
    except Exception as e:
      row["error"] = f"{type(e).__name__}: {e}"[:800]
    rows.append(row)
    print(f"{name}: " + (f"{row['predicted_s'] * 1e6:.1f} us at {row['mhz']} MHz "
                         f"({row['estimate_s']:.1f} s)" if "predicted_s" in row
                         else row["error"][:300]), flush=True)
  with open(out, "w") as fh:
    json.dump({"command": " ".join(sys.argv), "revision": _revision(),
               "at": at, "rows": rows}, fh, indent=1)


def compare(measured, predicted):
  """The table: each case's GPU time beside the model's, and the mean error."""
  gpu = {r["name"]: r for r in json.load(open(measured))["rows"]}
  model = {r["name"]: r for r in json.load(open(predicted))["rows"]}
  print("| case | GPU (us) | model (us) | error | clock (MHz) | kernels (GPU / model) |")
  print("|---|---:|---:|---:|---:|---|")
  errs = []
  for name, m in model.items():
    g = gpu.get(name, {})
    if "median_s" not in g or "predicted_s" not in m:
      why = g.get("error") or m.get("error") or "not measured"
      print(f"| {name} | - | - | - | - | {why[:80]} |")
      continue
    e = m["predicted_s"] / g["median_s"] - 1
    errs.append(abs(e))
    print(f"| {name} | {g['median_s'] * 1e6:.1f} | {m['predicted_s'] * 1e6:.1f} | {e:+.0%} | "
          f"{(g.get('clock') or {}).get('sm_mhz')} / {m.get('mhz')} | "
          f"{len(g.get('kernels', []))} / {len(m.get('kernels', []))} |")
  if errs:
    print(f"\n{len(errs)} cases: mean absolute error {sum(errs) / len(errs):.1%}, "
          f"largest {max(errs):.1%}")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = p.add_subparsers(dest="cmd", required=True)
  m = sub.add_parser("measure")
  m.add_argument("--out", required=True)
  m.add_argument("--only", default="")
  m.add_argument("--sustain-s", type=float, default=1.0)
  m.add_argument("--small", action="store_true", help="small sizes (a CPU's end-to-end run)")
  m.add_argument("--sim", action="store_true", help="every call in the simulator, on a CPU")
  r = sub.add_parser("predict")
  r.add_argument("--out", required=True)
  r.add_argument("--at", help="a measure run's tokamax_timing.json: predict at its clocks")
  r.add_argument("--only", default="")
  r.add_argument("--small", action="store_true")
  c = sub.add_parser("compare")
  c.add_argument("measured")
  c.add_argument("predicted")
  a = p.parse_args(argv)
  SMALL[0] = getattr(a, "small", False)
  if a.cmd == "measure":
    measure(a.out, a.only, a.sustain_s, sim=a.sim)
  elif a.cmd == "predict":
    predict(a.out, a.at, a.only)
  else:
    compare(a.measured, a.predicted)


if __name__ == "__main__":
  main()
