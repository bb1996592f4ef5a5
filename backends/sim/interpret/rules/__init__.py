"""One module per primitive family; importing this package registers them all."""
from pallas_sim.backends.sim.interpret.rules import (atomics, barriers, control_flow, debugging, inline_mgpu, lax_math, layouts, program_ids, refs, semaphores, tma, unsupported, warps, wgmma)  # noqa: F401
