"""The simulator backend. A launch flows through the folders in this order
(docs/architecture.md):

  frontend/   user function -> KernelLaunch (the only code that reads JAX internals)
  analysis/   static facts from the jaxpr: resources, block classes, paths
  interpret/  jaxpr -> Program of rule steps (rules/: one module per primitive family)
  execute/    prepare, run groups of blocks (in this process, workers or Ray), merge
  machine/    the simulated state the rules update (numerics/: how the GPU rounds)
  checks/     races, happens-before, uninitialized memory
  timing/     the cost model: cycles, occupancy, clock and power, bounds
  mlir/       the evaluator for plgpu.inline_mgpu bodies
  report/     Report, traces, plots, the profiler's output
"""
