"""Output regions a kernel's contract leaves unwritten.

The uninitialized-memory check fails a launch whose outputs have elements
no block wrote: on the hardware they hold whatever the memory held. Some
kernels leave parts unwritten by contract (a ragged dot's rows past the sum
of its group sizes; the caller reads only the written rows). Their caller
declares the region, by the kernel's name, as a function of the inputs the
kernel receives:

    ps.leave_unwritten("ragged_dot_sm90",
                       lambda lhs, rhs, *group_info: {0: np.s_[rows(...):]})

`region(*inputs)` gets the kernel's GMEM inputs as numpy arrays, in the
order the kernel takes them, and returns {output: where}, output an index
into the kernel's outputs or its parameter name, where a numpy index
expression or a boolean mask of the output's shape. Elements there may stay
unwritten; elements written there are still checked like any other (a read
of them before they are written is still a finding). Without a
declaration the check is as it was. The declaration holds for the process
(in a conftest.py or a `pytest -p` plugin, for a library's own tests), or
inside a `with` block when used as a context manager.
"""
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from pallas_sim.errors import KernelError

# kernel name -> [(region function, the file:line that declared it)], in
# declaration order
_DECLARED: dict[str, list[tuple[Callable[..., Any], str | None]]] = {}


class Declaration:
  """What leave_unwritten returns: in force from the call on, until
  `remove()` or the end of its `with` block."""

  def __init__(self, kernel_name, region, where=None):
    self.kernel_name, self.region = kernel_name, (region, where)
    _DECLARED.setdefault(kernel_name, []).append(self.region)

  def remove(self):
    regions = _DECLARED.get(self.kernel_name, [])
    if self.region in regions:
      regions.remove(self.region)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.remove()


def leave_unwritten(kernel_name, region):
  """Declares that kernel `kernel_name` (its `kernel_name=`, or the
  pallas_call's `name=`) may leave `region(*inputs)` of its outputs
  unwritten (see the module's docstring)."""
  if not callable(region):
    raise TypeError(f"leave_unwritten({kernel_name!r}, region): region must be a "
                    "function of the kernel's inputs returning {output: where}")
  caller = sys._getframe(1)  # pylint: disable=protected-access
  return Declaration(kernel_name, region, _place(caller.f_code.co_filename, caller.f_lineno))


def _place(path, line):
  rel = os.path.relpath(path) if os.path.isabs(path) else path
  return f"{rel if not rel.startswith('..') else path}:{line}"


def allowed(name, inputs, outputs, arg_names=()):
  """For each output (a shape) of kernel `name`, the boolean mask of
  elements declared as possibly unwritten, or None."""
  masks: list[np.ndarray | None] = [None] * len(outputs)
  # (the body's parameters: inputs, outputs, then scratch)
  n_in, n_out = len(inputs), len(outputs)
  out_names = tuple(arg_names[n_in:n_in + n_out]) if len(arg_names) >= n_in + n_out \
      else ()
  for region, declared_at in _DECLARED.get(name, ()):
    try:
      declared = region(*inputs)
    except Exception as e:
      raise KernelError(f"leave_unwritten({name!r}, ...): the region function raised "
                        f"{type(e).__name__}: {e}", where=declared_at) from e
    for key, where in dict(declared or {}).items():
      i = out_names.index(key) if isinstance(key, str) and key in out_names else key
      if not isinstance(i, (int, np.integer)) or not 0 <= i < len(outputs):
        raise KernelError(
            f"leave_unwritten({name!r}, ...): output {key!r} is not one of the "
            f"kernel's {len(outputs)} outputs"
            + (f" ({', '.join(out_names)})" if out_names else ""), where=declared_at)
      mask = np.zeros(outputs[i], bool)
      where = np.asarray(where) if isinstance(where, np.ndarray) else where
      if isinstance(where, np.ndarray) and where.dtype == bool:
        if where.shape != tuple(outputs[i]):
          raise KernelError(
              f"leave_unwritten({name!r}, ...): the mask for output {key!r} has shape "
              f"{where.shape}, the output {tuple(outputs[i])}", where=declared_at)
        mask |= where
      else:
        mask[where] = True
      masks[i] = mask if masks[i] is None else masks[i] | mask
  return masks
