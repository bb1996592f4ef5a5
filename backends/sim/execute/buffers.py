"""A launch's GMEM operands as simulator buffers: inputs lent or copied,
outputs made, and their sizes for the L2 model."""
import math

import numpy as np

from pallas_sim.backends.sim.checks import initcheck
from pallas_sim.backends.sim.interpret.rules import semaphores
from pallas_sim.backends.sim.machine import memory


def nbytes(a):
  """An array's (or an aval's) bytes, from its shape and dtype."""
  return math.prod(a.shape) * np.dtype(a.dtype).itemsize


def input_bytes(launch, arrays):
  """The bytes a launch's inputs hold."""
  return sum(map(nbytes, arrays[:launch.num_inputs]))


def footprint(launch, arrays):
  """The bytes a launch's inputs and outputs hold (an output that aliases
  an input counted once): what it can bring into the L2."""
  aliased = {o for _, o in launch.aliases}
  return (input_bytes(launch, arrays)
          + sum(nbytes(a) for i, a in enumerate(launch.out_avals) if i not in aliased))


def gmem_buffers(launch, arrays, prep, options, shapes_only, copy_inputs=False):
  """(input buffers, output buffers) of a launch."""
  n_in, n_out = launch.num_inputs, launch.num_outputs
  names = list(launch.arg_names[:n_in + n_out])
  if len(names) < n_in + n_out:
    names = [f"in{i}" for i in range(n_in)] + [f"out{j}" for j in range(n_out)]
  aliases = dict((o, i) for i, o in launch.aliases)
  # ps.estimate given shapes: zeros stand for the inputs it has no values
  # of (launch.unknown_inputs), and the outputs need no poison (values are
  # not computed): calloc'ed zeros, whose pages only what the kernel
  # touches costs. Constants the function captured keep their values.
  estimating = shapes_only and not options.numerics
  # An input the callback hands over read-only (its own copy of the
  # caller's array) is used as it is: most kernels never write an input,
  # and a copy of each would cost its size again. A kernel that does write
  # one fails that write (numpy refuses it, before any element changes) and
  # the launch runs again with copies (Executor.run_launch).
  # Copied at once: an input an output aliases, and the inputs of a
  # serial-only kernel (a re-run would print its debug_print lines twice).
  aliased = set(aliases.values())
  borrow = lambda i, a: (not copy_inputs and not prep.serial_only and i not in aliased
                         and isinstance(a, np.ndarray) and not a.flags.writeable)
  copy = lambda i, a: (np.zeros(np.shape(a), np.asarray(a).dtype)
                       if estimating and i in (launch.unknown_inputs or ()) else
                       a if borrow(i, a) else memory.copy(a))
  in_bufs = [semaphores.input_semaphores(names[i], launch.jaxpr.invars[i].aval, a)
             if i in prep.sem_inputs else memory.Buffer(names[i], "gmem", copy(i, a))
             for i, a in enumerate(arrays[:n_in])]
  for b, a in zip(in_bufs, arrays[:n_in]):
    b.lent = b.data is a
  out_bufs = []
  for j, aval in enumerate(launch.out_avals):
    if j in aliases:  # (holds the input's values: counts as written)
      out_bufs.append(in_bufs[aliases[j]])
    else:
      buf = memory.Buffer(names[n_in + j], "gmem",
                          np.zeros(aval.shape, aval.dtype) if not options.numerics
                          else memory.poison(aval.shape, aval.dtype))
      if options.check_uninitialized:
        initcheck.track(buf)
      out_bufs.append(buf)
  return in_bufs, out_bufs
