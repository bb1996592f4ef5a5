"""The timing model's verdict on a launch (timing/model.py, bound.py) as
its KernelReport."""
from pallas_sim.backends.sim.execute.buffers import input_bytes, nbytes
from pallas_sim.backends.sim.report import KernelReport
from pallas_sim.backends.sim.timing import bound


def kernel_report(gpu, launch, arrays, prep, grid, placement, merge, wall, trace, workers):
  cycles, totals = merge.cycles, merge.totals
  inputs = input_bytes(launch, arrays)
  outputs = sum(map(nbytes, launch.out_avals))
  if totals.tma_load_bytes + totals.tma_store_bytes:
    reads = (placement.hbm_reads_traced(merge.loads) if placement.trace_loads else
             placement.hbm_reads(totals.load_sites, inputs))
    writes = totals.tma_store_bytes
    # What plain loads and stores move beside the TMA's: HBM's too, up to the
    # inputs' and outputs' bytes (past those, the L2 serves re-reads, and
    # holds what is written again until it writes it back)
    reads = max(reads, min(reads + totals.plain_load_bytes, inputs))
    writes = max(writes, min(writes + totals.plain_store_bytes, outputs))
  else:  # (kernels without TMA move their operands with plain loads and stores)
    reads, writes = inputs, outputs
  hbm = reads + writes
  kt = placement.kernel_time(
      cycles, reads, writes,
      totals.hbm_read_cost / totals.tma_load_bytes if totals.tma_load_bytes else 1.0,
      totals.hbm_write_cost / totals.tma_store_bytes if totals.tma_store_bytes else 1.0)
  util = bound.utilisation(kt, totals, gpu)
  words, why = bound.name(kt, totals, util, prep.regs,
                         bound.busy_in_use(kt, totals, gpu, len(cycles)),
                         idle_sms=len(cycles) < gpu.num_sms)
  return KernelReport(
      name=launch.name, where=launch.where, grid=grid, num_threads=launch.num_threads,
      num_blocks=len(cycles), smem_bytes=prep.smem, blocks_per_sm=placement.per_sm,
      waves=placement.waves,
      block_cycles_min=float(cycles.min()) if len(cycles) else 0.0,
      block_cycles_mean=float(cycles.mean()) if len(cycles) else 0.0,
      block_cycles_max=float(cycles.max()) if len(cycles) else 0.0,
      time_s=kt.seconds, wall_s=wall, clock_hz=gpu.clock_hz, trace=trace,
      tma_load_bytes=totals.tma_load_bytes, tma_store_bytes=totals.tma_store_bytes,
      wgmma_flops=totals.wgmma_flops, tensor_f16_flops=totals.tensor_f16_flops,
      workers=workers, hbm_bytes=int(hbm),
      registers=prep.regs.per_thread, register_limit=prep.regs.limit,
      timing=kt, utilisation=util, stalls=bound.stall_shares(totals),
      bound=words, bound_reason=why, num_sms=gpu.num_sms)
