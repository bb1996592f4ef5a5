"""Primitives of the Mosaic GPU API that the simulator rejects by
name, each with its reason (any other primitive it does not model raises
the generic "not modelled" error), and the grid-dependency controls and
`reshard`, which need nothing here.

The rejection is raised when the kernel is compiled for the simulator, at
the user's line, before anything runs.
"""
from pallas_sim.backends.sim.interpret.compiler import rule
from pallas_sim.errors import UnsupportedPrimitiveError

_BLACKWELL = (
    "async_load",  # (TMEM loads)
    "tcgen05_mma", "tcgen05_commit_arrive", "async_copy_scales_to_tmem",
    "async_copy_smem_to_tmem", "async_copy_sparse_metadata_to_tmem",
    "async_store_tmem", "commit_tmem", "wait_load_tmem", "try_cluster_cancel",
    "query_cluster_cancel",
)
_OTHER_GPUS = (
    "multimem_load_reduce", "multimem_store", "semaphore_signal_multicast",
    # (the semaphores XLA keeps for a collective's clique of devices)
    "get_barrier_semaphore",
)
_PRE_HOPPER = ("wait_gmem_to_smem",)  # (cp.async copies, before TMA)
REASONS = {
    "wgmma": "the value form of wgmma, which only a discharged accumulator "
             "(state discharge of the kernel body) produces: use plgpu.wgmma "
             "on a plgpu.ACC accumulator",
    **{n: "it waits for cp.async copies, which GPUs before Hopper use: pallas-sim "
          "simulates a Hopper (sm_90) GPU, whose copies are TMA, awaited through "
          "barriers" for n in _PRE_HOPPER},
    **{n: "a Blackwell (sm_100) instruction: pallas-sim simulates a Hopper (sm_90) "
          "GPU, H100 or H200" for n in _BLACKWELL},
    **{n: "it acts on other GPUs (multicast memory, sharding): pallas-sim "
          "simulates one GPU" for n in _OTHER_GPUS},
}


# The API calls whose primitive's name is not the call's own.
_CALLED_AS = {"async_load": "plgpu.async_load_tmem"}


def _reject(eqn, cx):
  name = eqn.primitive.name
  called = f" ({_CALLED_AS[name]})" if name in _CALLED_AS else ""
  raise UnsupportedPrimitiveError(
      f"primitive '{name}'{called} is not supported: {REASONS[name]}")


rule(*REASONS)(_reject)


@rule("griddepcontrol_wait", "griddepcontrol_launch_dependents")
def _griddepcontrol(eqn, cx):
  # Programmatic dependent launch: launches run one after another here, so
  # the previous kernel has finished when this one starts.
  return lambda wg: []


@rule("reshard")
def _reshard(eqn, cx):
  # Inside a kernel the lowering makes reshard the identity: each GPU runs
  # the kernel on its own shard.
  return lambda wg, x: x
