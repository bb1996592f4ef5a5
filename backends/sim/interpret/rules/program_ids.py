"""Where a thread is: axis_index over grid, cluster and thread axes,
program_id / num_programs of pallas_call grids, and index hints."""
import numpy as np

from pallas_sim.backends.sim.interpret.compiler import rule
from pallas_sim.errors import KernelError


@rule("axis_index")
def _axis_index(eqn, cx):
  name = eqn.params["axis_name"]
  names = name if isinstance(name, tuple) else (name,)

  def axis_index(wg):
    idx = 0
    for n in names:
      if n not in wg.axes:
        raise KernelError(f"unknown axis name {n!r}; this kernel's axes are "
                          f"{sorted(map(str, wg.axes))}")
      idx = idx * wg.axes[n][1] + wg.axes[n][0]
    return np.int32(idx)
  return axis_index


@rule("program_id")
def _program_id(eqn, cx):
  axis = eqn.params["axis"]
  return lambda wg: np.int32(wg.axes[("grid", axis)][0])


@rule("num_programs")
def _num_programs(eqn, cx):
  axis = eqn.params["axis"]
  return lambda wg: np.int32(wg.axes[("grid", axis)][1])


@rule("multiple_of")
def _multiple_of(eqn, cx):
  return lambda wg, x: x
