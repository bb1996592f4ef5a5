"""The simulator backend. Its stages, top to bottom: each imports only the
ones below it (tests/test_layout.py; docs/architecture.md walks a launch
through them):

  execute/    prepare, run groups of blocks (in this process, workers or Ray), merge
  frontend/   user function -> KernelLaunch, handed to the executor that is active
  blocks/     which blocks to simulate: classes that cannot differ, paths for ps.estimate
  interpret/  jaxpr -> Program of rule steps (rules/: one module per primitive family)
  mlir/       the evaluator for plgpu.inline_mgpu bodies
  checks/     races, happens-before, semaphore order, uninitialized memory
  timing/     the cost model: cycles, occupancy, clock and power, bounds
  analysis/   static facts from the jaxpr: the one walker, resources, swizzle, congruence
  machine/    the simulated state the rules update (numerics/: how the GPU rounds)
  report/     Report, traces, plots, the profiler's output
  base/       the shared vocabulary: JAX's internals read in one place, source
              locations, events, loads
"""
