"""ps.estimate given shapes: the user's function traced to a jaxpr and walked
here, each kernel handed straight to the executor, with no XLA program run.

Given jax.ShapeDtypeStructs, an estimate needs no values (zeros stand in),
yet running the function through XLA cost about as much as simulating a
large kernel's classes: its zero inputs filled, handed to the callback, and
its outputs copied back (0.4 s of an 8192^3 f16 matmul's 0.9 s estimate).
Walked here, kernels get calloc'ed zeros, whose pages only what the kernel
touches costs.

Kernels at the top or inside calls (jit, checkpoint, custom_jvp/vjp/vmap) are
reached by the walk; every other equation is bound as it is, eagerly, on the
values it is given: a kernel inside it (in a scan, say) then runs through XLA
and the callback, as in ps.simulate. A function that needs its arguments'
values while traced (Python control flow on them) is not walked: `run`
raises NotWalked and the caller runs it on zeros (its Python then runs a
second time: what it prints while traced, it prints twice)."""
from typing import Any

import jax
import numpy as np
from jax.extend import core as jax_core
from jax.extend import source_info_util

from pallas_sim.backends.sim.analysis import walker
from pallas_sim.backends.sim.frontend import capture

# What a function traced with abstract arguments raises where it needs values.
_NEEDS_VALUES = (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
                 jax.errors.TracerBoolConversionError,
                 jax.errors.TracerIntegerConversionError)


class NotWalked(Exception):
  """The function cannot be walked as a jaxpr (the reason is the message)."""


def run(fn, args, kwargs):
  """fn(*args, **kwargs) with its arrays and ShapeDtypeStructs abstract while
  traced, then run: ShapeDtypeStructs as zeros, arrays as they are. Returns
  the flat outputs. Call inside a simulation (api._simulating)."""
  leaves, tree = jax.tree.flatten((args, kwargs))
  is_array = [isinstance(x, (jax.ShapeDtypeStruct, jax.Array, np.ndarray)) for x in leaves]
  arrays = [x for x, a in zip(leaves, is_array) if a]

  def flat(*xs):
    it = iter(xs)
    a, k = jax.tree.unflatten(tree, [next(it) if m else x for x, m in zip(leaves, is_array)])
    return fn(*a, **k)

  try:
    closed = jax.make_jaxpr(flat)(*arrays)
  except _NEEDS_VALUES as e:
    raise NotWalked(f"{type(e).__name__} while traced") from e
  values = [np.zeros(x.shape, x.dtype) if isinstance(x, jax.ShapeDtypeStruct) else x
            for x in arrays]
  unknown = {v for v, x in zip(closed.jaxpr.invars, arrays)
             if isinstance(x, jax.ShapeDtypeStruct)}
  return _eval(closed.jaxpr, closed.consts, values, unknown)


def _eval(jaxpr, consts, args, unknown):
  """Runs `jaxpr`; `unknown`: its variables whose values the estimate does
  not have (zeros stand in), to which it adds what it computes from them.
  Constants and arrays given keep their values: a kernel reads those."""
  env: dict[Any, Any] = {}
  read = lambda v: v.val if isinstance(v, jax_core.Literal) else env[v]
  is_unknown = lambda v: not isinstance(v, jax_core.Literal) and v in unknown
  env.update(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    body = (eqn.params[walker.CALLS[eqn.primitive.name]]
            if eqn.primitive.name in walker.CALLS else None)
    kernel = capture.is_sim_kernel(eqn)
    if kernel or any(map(is_unknown, eqn.invars)):
      unknown.update(eqn.outvars)  # (an estimate computes no kernel's values)
    if kernel:
      outs = _kernel(eqn, ins, frozenset(i for i, v in enumerate(eqn.invars)
                                         if is_unknown(v)))
    elif body is not None and _has_kernel(body):
      # (its constvars: those with consts)
      outs = _eval(body, getattr(body, "consts", ()), ins,
                   {b for b, v in zip(body.invars, eqn.invars) if is_unknown(v)})
    else:  # (as jax.core.eval_jaxpr binds it)
      with source_info_util.user_context(eqn.source_info.traceback,
                                         name_stack=eqn.source_info.name_stack), \
          eqn.ctx.manager:
        outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))
      if not eqn.primitive.multiple_results:
        outs = [outs]
    env.update(zip(eqn.outvars, outs))
  return [read(v) for v in jaxpr.outvars]


def _has_kernel(jaxpr):
  return any(capture.is_sim_kernel(e) for e in walker.equations(jaxpr))


def _kernel(eqn, ins, unknown_inputs):
  """The kernel's launch, checked as its lowering checks it, run now."""
  ins = [np.asarray(x) for x in ins]
  return list(capture.execute(capture.equation_launch(eqn, ins, unknown_inputs), *ins))
