"""Which SMs share a GPC, on a Hopper GPU (to explain the SMs that run a
memory-heavy matmul's blocks faster than the rest, pipeline_trace.py --spans).

A cluster's blocks run on SMs of one GPC. Launches of clusters of C blocks
(C = 2, 4, 8, 16 where the GPU takes it), each block recording its SM (the
profiler's track), join the SMs of each cluster; the groups left are the
GPCs (or parts of them that no cluster spanned). Prints each group's size
and SMs, and writes OUT/gpc_probe.json.

    python3 -m lab.gpc_probe --out $OUT      # on the GPU machine
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

from lab.pipeline_trace import newest_trace, ranges


def cluster_kernel(x, *, cluster, blocks, spin=20000, profile_dir=None):
  """Each block spins (so that many are resident at once) in a named scope,
  then writes one value."""
  import jax
  import jax.numpy as jnp
  from jax.experimental.pallas import mosaic_gpu as plgpu
  params = plgpu.CompilerParams(profile_space=8, profile_dir=profile_dir)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((blocks, 128), jnp.float32),
                grid=(blocks // cluster,), grid_names=("g",), cluster=(cluster,),
                cluster_names=("c",), compiler_params=params)
  def kernel(x_gmem, o_gmem):
    with jax.named_scope("spin"):
      v = jax.lax.fori_loop(0, spin, lambda i, v: v * 1.0001 + 1.0,
                            x_gmem[...])
    b = jax.lax.axis_index("g") * cluster + jax.lax.axis_index("c")
    o_gmem[b] = v

  return kernel(x)


def members(trace, cluster):
  """Per cluster of a trace: the SMs (tracks' pids) of its blocks."""
  tracks, sm_of = ranges(trace)
  groups = {}
  for tid in tracks:
    groups.setdefault((tid - 1) // cluster, set()).add(sm_of[tid])
  return list(groups.values())


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", default=os.environ.get("OUT", "."))
  a = ap.parse_args(argv)
  import jax
  import jax.numpy as jnp
  parent = {}

  def find(s):
    while parent.setdefault(s, s) != s:
      s = parent[s]
    return s

  runs = []
  x = jnp.ones((128,), jnp.float32)
  for cluster in (2, 4, 8, 16):
    blocks = 132 * 8 // cluster * cluster
    d = tempfile.mkdtemp(prefix="gpc_")
    try:
      jax.block_until_ready(jax.jit(lambda x: cluster_kernel(
          x, cluster=cluster, blocks=blocks, profile_dir=d))(x))
      jax.effects_barrier()
    except Exception as e:  # (a cluster larger than the GPU allows)
      runs.append({"cluster": cluster, "error": str(e).splitlines()[0][:300]})
      print(f"clusters of {cluster}: {runs[-1]['error']}", flush=True)
      continue
    groups = members(newest_trace(d), cluster)
    sms = sorted({s for g in groups for s in g})
    for g in groups:
      g = sorted(g)
      for s in g[1:]:
        parent[find(s)] = find(g[0])
    runs.append({"cluster": cluster, "blocks": blocks, "sms": len(sms),
                 "clusters": [sorted(g) for g in groups]})
    print(f"clusters of {cluster}: {len(groups)} clusters on {len(sms)} SMs", flush=True)
  comps = {}
  for s in list(parent):
    comps.setdefault(find(s), []).append(s)
  comps = sorted((sorted(v) for v in comps.values()), key=lambda v: v[0])
  print(f"{len(comps)} groups of SMs that clusters join, sizes "
        f"{sorted(len(v) for v in comps)}:")
  for v in comps:
    print(f"  {len(v)}: {v}")
  with open(os.path.join(a.out, "gpc_probe.json"), "w") as fh:
    json.dump({"command": " ".join(sys.argv), "runs": runs, "groups": comps}, fh)
  return 0


if __name__ == "__main__":
  sys.exit(main())
