"""examples/kernels.py: multi-thread, barrier, core_map, control-flow,
emit_pipeline and warp-specialized kernels, simulated against references."""
import numpy as np
import pytest

import kernels as K
import pallas_sim as ps

RUNNABLE = [e for e in K.EXAMPLES if e[0] not in K.NOT_LOWERABLE]


@pytest.mark.parametrize("name,fn,make_args,reference", RUNNABLE,
                         ids=[e[0] for e in RUNNABLE])
@pytest.mark.parametrize("seed", [0, 1])
def test_example_matches_reference_in_sim(name, fn, make_args, reference, seed):
  args = make_args(seed)
  out = ps.run(fn, *args, backend="sim")
  K._outputs_match(name, out, reference(*args))


def test_multithread_examples_really_use_several_threads():
  for name in ("two_thread_copy", "warp_specialized_matmul", "core_map_kernel"):
    fn, make_args = [(e[1], e[2]) for e in K.EXAMPLES if e[0] == name][0]
    sim = ps.simulate(fn, *make_args(0))
    assert sim.report.kernels[0].num_threads >= 2, name


def test_pallas_call_with_blockspecs_is_a_named_error():
  # 0.11.2 cannot lower this for a GPU either (see kernels.py); we say so.
  name, fn, make_args, _ = [e for e in K.EXAMPLES if e[0] == "pallas_call_kernel"][0]
  with pytest.raises(ps.UnsupportedPrimitiveError, match="BlockSpecs"):
    ps.run(fn, *make_args(0), backend="sim")


# (The guide is JAX's text, kept as written: its pl.program_id is deprecated
# in Mosaic GPU kernels, and JAX's lowering says so.)
@pytest.mark.filterwarnings("ignore:Using pl.program_id in Pallas MGPU is deprecated")
@pytest.mark.parametrize("which", ["matmul", "matmul_warp_specialized"])
def test_pipelining_guide_kernels_as_written(which):
  import pipelining_guide as G
  a, b = G.guide_inputs(m=2 * 128)
  sim = ps.simulate(getattr(G, which), a, b, on_race="report")
  got = np.asarray(sim.outputs, np.float32)
  want = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
  assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-3
  found = {(r.kind, r.second.buffer) for r in sim.report.races}
  if which == "matmul":
    assert not found
  else:
    # The guide's epilogue: every thread, the memory thread too, TMA-stores
    # all of o_smem with no barrier after the compute threads wrote it.
    assert found == {("write-read race", "o_smem"), ("write-write race", "o_gmem")}
