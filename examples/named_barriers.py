"""Named hardware barriers and async-proxy fences in plgpu kernels, the way
FlashAttention-3-style kernels hand buffers between warpgroups.

Mosaic GPU has no primitive for `bar.sync`/`bar.arrive`; kernels emit them
as inline PTX (or the NVVM ops) inside `plgpu.inline_mgpu`. The helpers
below do that, and `producer_consumer` uses them: one warp of the last
warpgroup loads K tiles and bias tiles into a two-slot ring with TMA; two
compute warpgroups each take q_wg @ K^T (wgmma, the async proxy) plus the
bias tile (plain loads, the generic proxy); a slot goes back to the
producer through named barrier EMPTY + slot, over 288 threads (two
warpgroups of 128 and one warp of 32). Because the bias is read by plain
loads and overwritten by TMA, an async-proxy fence must come between them:
in the producer after its bar.sync (`fence="producer"`), or in each
consumer before its arrival (`fence="consumer"`). `bug=...` builds racy or
misused twins for the tests.

    python examples/named_barriers.py     # runs it in the simulator
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, llvm, nvvm

EMPTY = 4            # first barrier id of our own (0..num_threads are Mosaic's)
THREADS = 2 * 128 + 32
TILE_Q, TILE_K, HEAD = 64, 64, 64


def _i32(v):
  return arith.constant(ir.IntegerType.get_signless(32), v)


def bar(op, barrier_id, num_threads, form="ptx"):
  """`bar.{op} barrier_id, num_threads` (op: "sync" or "arrive"); the id a
  Python int or a traced int32. form="nvvm": the same as nvvm.barrier /
  nvvm.barrier.arrive ops."""
  def emit(bid):
    if form == "nvvm":
      if op == "sync":
        nvvm.barrier(barrier_id=bid, number_of_threads=_i32(num_threads))
      else:
        nvvm.barrier_arrive(_i32(num_threads), barrier_id=bid)
      return
    operands, text, constraints = [], f"bar.{op} {barrier_id}, {num_threads};", ""
    if not isinstance(barrier_id, int):
      operands, text, constraints = [bid], f"bar.{op} $0, {num_threads};", "r"
    llvm.inline_asm(ir.Type.parse("!llvm.void"), operands, text, constraints,
                    has_side_effects=True)

  if isinstance(barrier_id, int):
    @plgpu.inline_mgpu()
    def static(_):
      emit(_i32(barrier_id))
    return static()

  @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WG_SPLAT,))
  def dynamic(_, bid):
    emit(bid.registers[()])
  return dynamic(barrier_id)


@plgpu.inline_mgpu()
def fence_async_shared(_):
  """`fence.proxy.async.shared::cta`: this thread's generic-proxy SMEM
  accesses, and those released to it, are ordered before the async-proxy
  work (TMA, wgmma) it issues next."""
  nvvm.fence_proxy(nvvm.ProxyKind.async_shared, space=nvvm.SharedSpace.shared_cta)


def _transforms():
  return (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))


def producer_consumer(q, k, bias, *, fence="producer", bug=None, form="ptx"):
  """out[wg] = sum over steps i of q[wg] @ k[i]^T + bias[i], wg in {0, 1}.
  q: (2, 64, 64) bf16, k: (steps, 64, 64) bf16, bias: (steps, 64, 64) f32.

  bug: "arrive_early" (a consumer releases its slot before reading it),
  "count" (the consumers give another thread count), "one_consumer" (only
  consumer 0 releases: the producer's bar.sync never completes),
  "reserved_id" (barrier 1, which Mosaic uses for warpgroup 0)."""
  steps = k.shape[0]
  empty = 1 if bug == "reserved_id" else EMPTY
  consumer_count = 256 if bug == "count" else THREADS

  def kernel(q_gmem, k_gmem, b_gmem, o_gmem, q_smem, k_ring, b_ring, o_smem,
             q_full, k_full, b_full):
    wg = lax.axis_index("wg")

    def release(s):
      bar("arrive", empty + s, consumer_count, form)

    @pl.when(wg < 2)
    def consumer():
      @pl.when(wg == 0)
      def _():
        plgpu.copy_gmem_to_smem(q_gmem, q_smem, q_full)
      plgpu.barrier_wait(q_full)

      def step(i, acc):
        s = lax.rem(i, 2)
        plgpu.barrier_wait(k_full.at[s])

        def qk(acc_ref):
          plgpu.wgmma(acc_ref, q_smem.at[wg], k_ring.at[s].T)
        acc = pl.run_state(qk)(plgpu.ACC.init(acc))
        plgpu.barrier_wait(b_full.at[s])
        if bug == "arrive_early":
          release(s)
        acc = acc + b_ring[s]
        if fence == "consumer":
          fence_async_shared()
        if bug == "one_consumer":
          pl.when(wg == 0)(lambda: release(s))
        elif bug != "arrive_early":
          release(s)
        return acc

      acc = plgpu.layout_cast(jnp.zeros((TILE_Q, TILE_K), jnp.float32),
                              plgpu.Layout.WGMMA)
      acc = lax.fori_loop(0, steps, step, acc)
      o_smem[wg] = acc
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(o_smem.at[wg], o_gmem.at[wg])
      plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 2)
    def producer():
      @plgpu.warp_map
      def _(warp):
        @pl.when(warp == 0)
        def _():
          @pl.loop(0, steps)
          def _(i):
            s = lax.rem(i, 2)

            @pl.when(i >= 2)
            def _():
              bar("sync", empty + s, THREADS, form)
              if fence == "producer":
                fence_async_shared()
            plgpu.copy_gmem_to_smem(k_gmem.at[i], k_ring.at[s], k_full.at[s])
            plgpu.copy_gmem_to_smem(b_gmem.at[i], b_ring.at[s], b_full.at[s])

  return plgpu.kernel(
      kernel,
      out_type=jax.ShapeDtypeStruct((2, TILE_Q, TILE_K), jnp.float32),
      scratch_types=[
          plgpu.SMEM((2, TILE_Q, HEAD), jnp.bfloat16, transforms=_transforms()),
          plgpu.SMEM((2, TILE_K, HEAD), jnp.bfloat16, transforms=_transforms()),
          plgpu.SMEM((2, TILE_Q, TILE_K), jnp.float32),
          plgpu.SMEM((2, TILE_Q, TILE_K), jnp.float32),
          plgpu.Barrier(), plgpu.Barrier(num_barriers=2),
          plgpu.Barrier(num_barriers=2),
      ],
      num_threads=3, thread_name="wg",
  )(q, k, bias)


def producer_consumer_args(seed, steps=6):
  rng = np.random.default_rng(seed)
  q = rng.uniform(-1, 1, (2, TILE_Q, HEAD)).astype(jnp.bfloat16)
  k = rng.uniform(-1, 1, (steps, TILE_K, HEAD)).astype(jnp.bfloat16)
  bias = rng.uniform(-1, 1, (steps, TILE_Q, TILE_K)).astype(np.float32)
  return jnp.asarray(q), jnp.asarray(k), jnp.asarray(bias)


def producer_consumer_reference(q, k, bias):
  q, k, b = (np.asarray(x, np.float32) for x in (q, k, bias))
  return np.einsum("wqd,skd->wqk", q, k) + b.sum(0)[None]


def ping_pong(x, *, back=True, fence=True, delays=(0, 0)):
  """out = x.sum(0), x: (rounds, 64, 128) f32. Warpgroups 0 and 1 take
  turns on one SMEM tile: 0 loads round r's tile with TMA, waits for it and
  hands it over with bar.arrive(EMPTY, 256); 1 waits with
  bar.sync(EMPTY, 256), adds it up and hands the tile back through
  bar.arrive(EMPTY + 1, 256), which 0 syncs on (then fences: its next TMA
  load overwrites what 1 read with plain loads) before the next load.
  back=False drops the hand-back: 0 then loads again while 1 may still be
  reading, and its next arrival can land in the phase before. delays:
  nanoseconds each warpgroup sleeps a round (pl.delay), to move the timing."""
  rounds = x.shape[0]

  def kernel(x_gmem, o_gmem, tile, o_smem, loaded):
    wg = lax.axis_index("wg")

    @pl.when(wg == 0)
    def first():
      @pl.loop(0, rounds)
      def _(r):
        @pl.when(r > 0)
        def _():
          if back:
            bar("sync", EMPTY + 1, 256)
          if fence:
            fence_async_shared()
        if delays[0]:
          pl.delay(delays[0])
        plgpu.copy_gmem_to_smem(x_gmem.at[r], tile, loaded)
        plgpu.barrier_wait(loaded)
        bar("arrive", EMPTY, 256)

    @pl.when(wg == 1)
    def second():
      def body(r, acc):
        if delays[1]:
          pl.delay(delays[1])
        bar("sync", EMPTY, 256)
        acc = acc + tile[...]

        @pl.when(r + 1 < rounds)
        def _():
          if back:
            bar("arrive", EMPTY + 1, 256)
        return acc
      acc = lax.fori_loop(0, rounds, body, jnp.zeros(tile.shape, jnp.float32))
      o_smem[...] = acc
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(o_smem, o_gmem)
      plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(
      kernel, out_type=jax.ShapeDtypeStruct(x.shape[1:], jnp.float32),
      scratch_types=[plgpu.SMEM(x.shape[1:], jnp.float32),
                     plgpu.SMEM(x.shape[1:], jnp.float32), plgpu.Barrier()],
      num_threads=2, thread_name="wg")(x)


if __name__ == "__main__":
  import pallas_sim as ps
  args = producer_consumer_args(0)
  sim = ps.simulate(producer_consumer, *args, gpu="h200")
  err = np.abs(np.asarray(sim.outputs) - producer_consumer_reference(*args)).max()
  print(f"producer_consumer: max |sim - reference| = {err:.2e}")
  print(sim.report.summary())
