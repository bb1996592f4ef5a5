"""Evaluates one Pallas thread's jaxpr.

A jaxpr is compiled once per launch shape into a `Program`: a flat list of
steps, each holding the rule's closure, the env slots it reads and writes, and
its issue cost. Rules are registered per primitive name by the modules in
`rules/`, each with the OpClass the timing model costs it by; a rule is a
*builder* `(eqn, cx) -> fn`, so that parameters are decoded once, not at
every block. A step whose rule may block (barrier waits,
async waits, control flow around them) runs as a generator that yields wait
requests to the scheduler; all other steps are plain calls.
"""
from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import jax.numpy as jnp
import numpy as np
from jax.extend import core as jax_extend_core

from pallas_sim.errors import SimError, SimInternalError, not_modelled
from pallas_sim.options import MAX_CYCLES
from pallas_sim.backends.sim.base import locations
from pallas_sim.backends.sim.report import profiler
from pallas_sim.backends.sim.analysis import walker
from pallas_sim.backends.sim.base.jax_internals import primitive_name
from pallas_sim.backends.sim.machine import memory
from pallas_sim.backends.sim.timing.model import OpClass, alu_share, alu_span, tensor_overlap

if TYPE_CHECKING:
  from pallas_sim.backends.sim.machine.state import Warpgroup
  from pallas_sim.backends.sim.timing.model import Timing


class Launch(Protocol):
  """What the compiler itself reads of a kernel launch (frontend/capture.py's
  KernelLaunch, a stage above this one: rules read more of it)."""

  @property
  def where(self) -> str: ...


# A rule: (eqn, compiler) -> the step's function, plain or wrapped in Gen.
Builder = Callable[[Any, "Compiler"], Any]
B = TypeVar("B", bound=Callable[..., Any])

RULES: dict[str, Builder] = {}
# primitive name -> the OpClass its issue costs (timing/model.py): the
# rule's declaration; the primitive's own even where a slice overrides its
# rule, or an add is fused into an FMA step.
OP_CLASSES: dict[str, OpClass] = {}


def rule(*names: str, op: OpClass = OpClass.ALU) -> Callable[[B], B]:
  """Registers a builder for the given primitive names, which issue as `op`."""
  def deco(builder: B) -> B:
    for n in names:
      RULES[n] = builder
      OP_CLASSES[n] = op
    return builder
  return deco


class Gen:
  """Marks a rule function that is a generator (may block)."""
  __slots__ = ("fn",)

  def __init__(self, fn: Callable[..., Generator[Any, Any, Any]]) -> None:
    self.fn = fn


class Step:
  # op: its OpClass, which the timing model reads (never the primitive's
  # name). cost: cycles of the SM's ALUs (shared with the warpgroups beside
  # it: alu_share); lat: cycles of the equation's own issue latency, which
  # a warpgroup spends alone (others issue meanwhile: timing/model.py).
  # beside: how much slower its ALU work goes while a wgmma is in flight on
  # the SM (Timing.beside_tensor).
  __slots__ = ("fn", "ins", "outs", "gen", "multi", "eqn", "op", "cost", "lat", "where",
               "beside")
  fn: Callable[..., Any]      # (wg, *operands) -> outputs; a generator where gen
  ins: tuple[int, ...]        # env slots of its operands
  outs: tuple[int, ...]       # env slots of its results
  gen: bool
  multi: bool                 # the primitive has multiple results
  eqn: jax_extend_core.JaxprEqn | None  # (None: the profile's closing step)
  op: OpClass
  cost: float
  lat: float
  where: str
  beside: float


class Program:
  __slots__ = ("steps", "invars", "outvars", "template", "blocking", "jaxpr")
  steps: list[Step]
  invars: list[int]           # env slots the arguments go to
  outvars: list[int]          # env slots the results come from
  template: list[Any]         # the env before a run: constants and literals
  blocking: bool              # some step is a generator: run with run_gen
  jaxpr: jax_extend_core.Jaxpr


def literal_value(v: Any) -> Any:
  aval = v.aval
  return np.asarray(v.val, dtype=aval.dtype) if aval.shape else (
      np.asarray(v.val, dtype=aval.dtype)[()])


# What keeps the tensor cores busy beside other warpgroups' ALU work.
TENSOR_CORE_WORK = frozenset({"wgmma_ref"})


class Compiler:
  """Compiles jaxprs to Programs; one per launch (rules may close over launch
  facts, and ask the timing model, timing/model.py, for costs)."""

  def __init__(self, timing: Timing, launch: Launch | None = None,
               max_cycles: float = MAX_CYCLES, numerics: bool = True, *,
               skip_float_values: bool = False, sites: dict[int, int] | None = None,
               keep: dict[int, Sequence[bool]] | None = None,
               overrides: dict[str, Builder] | None = None,
               wrap: Callable[[Callable[..., Any], Any], Callable[..., Any]] | None = None
               ) -> None:
    self.timing = timing
    self.launch = launch
    self.numerics = numerics  # False: the tensor cores' sums are skipped
    # True (execute/prepare.py): float elementwise math gives zeros, uncomputed
    self.skip_float_values = skip_float_values
    # id(eqn) -> its number, for equations a rule asks to number
    self.sites = {} if sites is None else dict(sites)
    self.max_cycles = max_cycles  # loops end a runaway block past this
    self._cache: dict[tuple[int, bool, int], tuple[Any, Program]] = {}
    self._where = [launch.where if launch is not None else "<unknown location>"]
    # Byte offset in SMEM where the scope being compiled starts its
    # allocations (interpret/rules/refs.py, run_scoped; resources.scope_layout).
    self.smem_base = 0
    # Named scopes open and close regions of the kernel's profile (report/profiler.py)
    self.profile = launch is not None and getattr(launch, "profile", None) is not None
    # A slice of the kernel (blocks/paths.py): only these equations
    # ({id: which operands it needs}; zeros stand for the values it does
    # not), with these rules in place of the simulator's where given.
    self.keep = keep
    self.overrides = overrides or {}
    self.wrap = wrap  # (fn, eqn) -> fn: a check around every plain step (blocks/paths.py)
    # Several warpgroups a block share its SM's ALUs and tensor cores: in a
    # kernel with wgmmas their loops let the simulation catch up with the
    # others each iteration (rules/control_flow.py), so that ALU work sees
    # the wgmmas issued beside it. Not in a slice (blocks/paths.py: it
    # follows control paths, not clocks). Set as the kernel is compiled.
    self.interleave: bool | None = None if (
        keep is None and launch is not None
        and (getattr(launch, "num_threads", None) or 1) > 1) else False

  def site(self, eqn: Any) -> int:
    """A number for `eqn`, in the order rules ask (the same in every process
    that compiles the same kernel: a Ray task's tallies key by it)."""
    return self.sites.setdefault(id(eqn), len(self.sites))

  def where(self, eqn: Any) -> str:
    """The user's file:line for `eqn`; equations JAX helpers traced for the
    user take the location of the user's call that contains them."""
    return locations.eqn_location(eqn) or self._where[-1]

  def compile(self, jaxpr: jax_extend_core.Jaxpr | jax_extend_core.ClosedJaxpr,
              consts: Sequence[Any] | None = None) -> Program:
    """A ClosedJaxpr's consts are baked in; an open Jaxpr's constvars must be
    none (use compile_open)."""
    if hasattr(jaxpr, "consts"):
      jaxpr, consts = jaxpr.jaxpr, [np.asarray(c) for c in jaxpr.consts]
    if self.interleave is None:  # (the kernel: compiled first)
      self.interleave = any(primitive_name(e) in TENSOR_CORE_WORK
                            for e in walker.equations(jaxpr))
    return self._cached(jaxpr, consts or (), False)

  def compile_open(self, jaxpr: Any) -> Program:
    """Compiles a Jaxpr whose constvars are bound at run time, before its
    invars (run_scoped's closed-over operands)."""
    return self._cached(jaxpr, (), True)

  def _cached(self, jaxpr: Any, consts: Sequence[Any], open_consts: bool) -> Program:
    key = (id(jaxpr), open_consts, self.smem_base)
    hit = self._cache.get(key)
    if hit is not None and hit[0] is jaxpr:
      return hit[1]
    prog = self._compile(jaxpr, consts, open_consts)
    self._cache[key] = (jaxpr, prog)
    return prog

  def _compile(self, jaxpr: Any, consts: Sequence[Any], open_consts: bool) -> Program:
    slots: dict[Any, int] = {}
    template: list[Any] = []

    def slot(v: Any) -> int:
      s = slots.get(v)
      if s is None:
        s = slots[v] = len(template)
        template.append(None)
      return s

    def read(v: Any) -> int:
      if isinstance(v, jax_extend_core.Literal):
        template.append(literal_value(v))
        return len(template) - 1
      return slot(v)

    if not open_consts:
      if len(consts) != len(jaxpr.constvars):
        raise SimError(f"jaxpr has {len(jaxpr.constvars)} constvars, "
                       f"{len(consts)} values given")
      for v, c in zip(jaxpr.constvars, consts):
        template[slot(v)] = c
    prog = Program()
    prog.jaxpr = jaxpr
    leading = list(jaxpr.constvars) if open_consts else []
    prog.invars = [slot(v) for v in leading + list(jaxpr.invars)]
    prog.steps = []
    blocking = False
    fused = contractions(jaxpr)
    folded = _folded_products(jaxpr, fused)
    scopes: list[str] = []  # (the profile's open regions, as the lowering tracks them)
    for eqn in jaxpr.eqns:
      if self.keep is not None and id(eqn) not in self.keep:
        continue
      where = self.where(eqn)
      name = primitive_name(eqn)
      builder = self.overrides.get(name) or RULES.get(name)
      if id(eqn) in fused:
        builder = RULES["fma"]
      if builder is None:
        raise not_modelled(
            f"primitive '{name}' is not modelled by the simulator "
            "(see README: supported primitives)", primitive=name,
            where=where)
      self._where.append(where)
      try:
        fn = builder(eqn, self)
      except SimError as e:
        raise _located(e, eqn, where)
      finally:
        self._where.pop()
      if self.skip_float_values and _float_math(eqn, builder):
        fn = _zeros_of(eqn.outvars[0].aval)
      if self.wrap is not None and not isinstance(fn, Gen):
        fn = self.wrap(fn, eqn)
      st = Step()
      st.eqn = eqn
      st.where = where
      st.gen = isinstance(fn, Gen)
      st.fn = fn.fn if st.gen else fn
      blocking |= st.gen
      if id(eqn) in fused:  # (x, y, c, product sign, addend sign)
        mul, sp, sc, c = fused[id(eqn)]
        st.ins = tuple(read(v) for v in (*mul.invars, c)) + (
            len(template), len(template) + 1)
        template.extend([sp, sc])
      elif self.keep is not None:
        st.ins = tuple(read(v) if n or hasattr(v.aval, "inner_aval") else
                       _constant(template, np.zeros(v.aval.shape, v.aval.dtype))
                       for v, n in zip(eqn.invars, self.keep[id(eqn)]))
      else:
        st.ins = tuple(read(v) for v in eqn.invars)
      st.outs = tuple(slot(v) for v in eqn.outvars)
      st.multi = eqn.primitive.multiple_results
      st.op = OP_CLASSES.get(name, OpClass.ALU)
      # (a product used only by the adds it is fused into costs nothing apart)
      st.lat, st.cost = (0.0, 0.0) if id(eqn) in folded else self.timing.issue_split(
          st.op, eqn, getattr(self.launch, "approx_math", False))
      st.beside = self.timing.beside_tensor(st.op, eqn)
      if self.profile:
        names = [sc.name for sc in eqn.source_info.name_stack.stack]
        _profiled(st, *profiler.scope_changes(scopes, names), scopes)
        scopes = names
      prog.steps.append(st)
    if self.profile and scopes:  # (what is open closes at the jaxpr's end)
      end = Step()
      end.eqn, end.where, end.gen, end.fn = None, self._where[-1], False, lambda wg: None
      end.op = OpClass.ALU
      end.ins, end.outs, end.multi, end.cost, end.lat, end.beside = (), (), False, 0, 0, 1
      _profiled(end, len(scopes), [], scopes)
      prog.steps.append(end)
    prog.outvars = [read(v) for v in jaxpr.outvars]
    if any(_gmem_load(st.eqn) for st in prog.steps):
      _await_gmem_loads(prog, template, self.timing.gpu, self._where[-1])
    prog.template = template
    prog.blocking = blocking
    return prog


# Plain loads of GMEM (no TMA: a get or plgpu.load of a GMEM ref) return
# their value after the memory's latency (gpus.GPU.gmem_load_latency): the
# warpgroup goes on issuing, and waits at the first step that reads the value,
# or where the program hands it on (a loop's carry, a branch's result).
GMEM_LOADS = frozenset({"get", "load"})
# Steps that only rename a value's registers (no instruction): their result
# is ready when their operand is, and they do not wait for it.
RENAMES = frozenset({"layout_cast", "reshape", "squeeze", "expand_dims"})


def in_gmem(eqn: Any) -> bool:
  """Whether the ref an equation reads or writes (its first operand) is GMEM."""
  return str(getattr(eqn.invars[0].aval, "memory_space", "")) in ("gmem", "any")


def _gmem_load(eqn: Any) -> bool:
  return (eqn is not None and primitive_name(eqn) in GMEM_LOADS and len(eqn.outvars) == 1
          and in_gmem(eqn))


def _await_gmem_loads(prog: Program, template: list[Any], gpu: Any, where: str) -> None:
  """Each plain GMEM load also gives the time its value is ready, in a slot of
  its own; the steps that read the value wait for it first."""
  ready: dict[int, int] = {}  # a loaded value's slot -> its ready time's slot
  for st in prog.steps:
    waits = tuple(dict.fromkeys(ready[i] for i in st.ins if i in ready))
    if (len(waits) == 1 and len(st.outs) == 1 and st.eqn is not None
        and primitive_name(st.eqn) in RENAMES):
      ready[st.outs[0]] = waits[0]
      continue
    if waits:
      _wait_first(st, waits)
    if _gmem_load(st.eqn) and not st.gen and not st.multi:
      ready[st.outs[0]] = len(template)
      st.outs = (st.outs[0], len(template))
      template.append(0.0)
      st.multi = True
      st.fn = _timed_load(st.fn, gpu)
  pending = tuple(dict.fromkeys(ready[i] for i in prog.outvars if i in ready))
  if pending:
    end = Step()
    end.eqn, end.where, end.gen, end.op = None, where, False, OpClass.ALU
    end.ins, end.outs, end.multi, end.cost, end.lat, end.beside = pending, (), False, 0, 0, 1
    end.fn = lambda wg, *times: _await(wg, times)
    prog.steps.append(end)


def _timed_load(fn: Callable[..., Any], gpu: Any) -> Callable[..., Any]:
  hbm_from = gpu.l2_bytes // 2  # (a buffer past half the L2: its loads miss)

  def load(wg: Warpgroup, ref: Any, *idx: Any) -> tuple[Any, float]:
    value = fn(wg, ref, *idx)
    buf = getattr(ref, "buf", ref)
    nbytes = getattr(buf, "nbytes", 0)
    read = wg.block.gmem_read
    if nbytes <= gpu.gmem_l1_bytes and id(buf) in read:
      return value, wg.time + gpu.gmem_l1_latency
    read.add(id(buf))
    lat = gpu.gmem_load_latency + (gpu.gmem_hbm_latency_extra if nbytes > hbm_from else 0)
    return value, wg.time + lat
  return load


def _await(wg: Warpgroup, times: Sequence[float]) -> None:
  t = max(times)
  if t > wg.time:
    since = wg.time
    wg.time = t
    wg.stalled("GMEM load", since)


def _wait_first(st: Step, waits: tuple[int, ...]) -> None:
  """Step `st` first waits for the ready times in slots `waits` (its last
  operands from now on)."""
  k = len(waits)
  st.ins = st.ins + waits
  inner = st.fn
  if st.gen:
    def gen(wg: Warpgroup, *args: Any) -> Generator[Any, Any, Any]:
      _await(wg, args[-k:])
      return (yield from inner(wg, *args[:-k]))
    st.fn = gen
  else:
    def plain(wg: Warpgroup, *args: Any) -> Any:
      _await(wg, args[-k:])
      return inner(wg, *args[:-k])
    st.fn = plain


def _constant(template: list[Any], value: Any) -> int:
  template.append(value)
  return len(template) - 1


def _float_math(eqn: Any, builder: Builder) -> bool:
  """Whether eqn is pure math (a lax_math rule) with one float array out."""
  if eqn.primitive.multiple_results or len(eqn.outvars) != 1:
    return False
  if not builder.__module__.endswith("rules.lax_math"):
    return False
  aval = eqn.outvars[0].aval
  dtype = getattr(aval, "dtype", None)
  return (not hasattr(aval, "inner_aval") and dtype is not None
          and jnp.issubdtype(dtype, jnp.floating) and bool(getattr(aval, "shape", ())))


def _zeros_of(aval: Any) -> Callable[..., np.ndarray]:
  shape, dtype = tuple(aval.shape), np.dtype(aval.dtype)
  return lambda wg, *args: np.zeros(shape, dtype)


def _profiled(st: Step, closes: int, opens: Sequence[str], open_names: Sequence[str]
              ) -> None:
  """Wraps step `st` so that it first closes `closes` of the regions
  `open_names` and opens `opens` in the warpgroup's profile."""
  if not closes and not opens:
    return
  events = [(n, False) for n in reversed(open_names[len(open_names) - closes:])]
  events += [(n, True) for n in opens]
  fn = st.fn

  def record(wg: Warpgroup) -> None:
    rec = wg.block.group.profile
    for name, begin in events:
      rec.event(wg, name, begin)

  if st.gen:
    def gen(wg: Warpgroup, *args: Any) -> Generator[Any, Any, Any]:
      record(wg)
      return (yield from fn(wg, *args))
    st.fn = gen
  else:
    def plain(wg: Warpgroup, *args: Any) -> Any:
      record(wg)
      return fn(wg, *args)
    st.fn = plain


def contractions(jaxpr: Any) -> dict[int, tuple[Any, float, float, Any]]:
  """Float `add`/`sub` equations with an operand computed by a `mul`: the GPU
  compiler (LLVM's NVPTX backend, which fuses aggressively: even a product
  with other uses) contracts them into one fused multiply-add, rounded once.
  Measured on an H200 for f32, f16 and bf16 (lab/contraction_probe.py);
  with two products, the first operand's is fused. Returns {id(add eqn):
  (mul eqn, product sign, addend sign, addend)}."""
  muls = {e.outvars[0]: e for e in jaxpr.eqns if e.primitive.name == "mul"
          and memory.is_float(e.outvars[0].aval.dtype)}
  zeros = _known_zeros(jaxpr)
  fused = {}
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name not in ("add", "sub"):
      continue
    a, b = eqn.invars
    # p + 0 with a zero the compiler knows (a literal, zeros_like, an iota
    # along an axis of size 1): the add folds away and the product stays
    # unrounded for the next add (measured on an H200,
    # benchmarks/register_numerics_probe.py).
    if _is_zero(b, zeros) and _in(a, muls):
      muls[eqn.outvars[0]] = muls[a]
    elif name == "add" and _is_zero(a, zeros) and _in(b, muls):
      muls[eqn.outvars[0]] = muls[b]
    for i, v in enumerate((a, b)):
      if not _in(v, muls):
        continue
      if muls[v].outvars[0].aval.shape != eqn.outvars[0].aval.shape:
        continue
      other = b if i == 0 else a
      # add: p + c; sub(p, c): p - c; sub(c, p): -p + c
      sp = -1.0 if (name == "sub" and i == 1) else 1.0
      sc = -1.0 if (name == "sub" and i == 0) else 1.0
      fused[id(eqn)] = (muls[v], sp, sc, other)
      break
  return fused


def _folded_products(jaxpr: Any, fused: dict[int, tuple[Any, float, float, Any]]
                     ) -> set[int]:
  """ids of the `mul` equations whose every use is an add fused with them
  (contractions): the GPU computes them inside the FMA, not apart."""
  fused_muls = {id(m) for m, _, _, _ in fused.values()}
  uses: dict[jax_extend_core.Var, list[jax_extend_core.JaxprEqn]] = {}
  for eqn in jaxpr.eqns:
    for v in eqn.invars:
      if not isinstance(v, jax_extend_core.Literal):
        uses.setdefault(v, []).append(eqn)
  outs = set(v for v in jaxpr.outvars if not isinstance(v, jax_extend_core.Literal))
  folded = set()
  for eqn in jaxpr.eqns:
    if id(eqn) not in fused_muls:
      continue
    [v] = eqn.outvars
    if v not in outs and all(id(u) in fused and fused[id(u)][0] is eqn
                             for u in uses.get(v, ())):
      folded.add(id(eqn))
  return folded


def _in(v: Any, table: Any) -> bool:
  """v (a Var; Literals are unhashable and never in `table`) in table."""
  return not isinstance(v, jax_extend_core.Literal) and v in table


def _is_zero(v: Any, zeros: set[Any]) -> bool:
  """Whether v is 0 everywhere at compile time (a literal, or in `zeros`)."""
  if isinstance(v, jax_extend_core.Literal):
    return bool(np.all(np.asarray(v.val) == 0))
  return v in zeros


def _known_zeros(jaxpr: Any) -> set[Any]:
  """Vars whose every element is 0 at compile time: an iota along an axis
  of size 1, and casts, broadcasts and reshapes of zeros (jnp.zeros_like is
  a broadcast of a literal 0)."""
  zeros = set()
  for eqn in jaxpr.eqns:
    p = eqn.params
    if eqn.primitive.name == "iota":
      if p["shape"][p["dimension"]] == 1:
        zeros.add(eqn.outvars[0])
    elif eqn.primitive.name in ("convert_element_type", "broadcast_in_dim", "reshape",
                                "squeeze", "expand_dims") and eqn.invars:
      if _is_zero(eqn.invars[0], zeros):
        zeros.add(eqn.outvars[0])
  return zeros


def _located(e: BaseException, eqn: Any, where: str, wg: Any = None) -> BaseException:
  """Attach the user's file:line (and the warpgroup, at run time) to an
  error raised inside a rule; anything that is not a SimError is a bug of
  ours, kept as the cause."""
  if isinstance(e, SimError):
    if e.where is None:
      e.where = where
      e.primitive = e.primitive or primitive_name(eqn)
      who = f" (in {wg.name})" if wg is not None else ""
      e.args = (f"{e.where}: [{e.primitive}] {e.args[0]}{who}",)
    e.__suppress_context__ = True
    return e
  err = SimInternalError(
      f"internal error while simulating this equation: {type(e).__name__}: {e}",
      primitive=primitive_name(eqn), where=where)
  err.__cause__ = e
  return err


# run_plain and run_gen are the same loop: a generator costs a frame switch
# per step, and most programs (and most loop bodies) never block.
def run_plain(prog: Program, args: Sequence[Any], wg: Warpgroup) -> list[Any]:
  """Evaluates a non-blocking program for warpgroup wg; returns its outputs."""
  env = prog.template.copy()
  for i, a in zip(prog.invars, args):
    env[i] = a
  wg.steps += len(prog.steps)  # (counted as a program starts: for progress)
  # (the SM's ALUs, shared: timing/model.py)
  stretch, until, owe = alu_share(wg, wg.time)
  eng = wg.block.engines  # (its tensor cores: ALU work beside them is slower)
  st: Step | None = None
  try:
    for st in prog.steps:
      out = st.fn(wg, *[env[i] for i in st.ins])
      wg.alu += st.cost
      t = wg.time + st.lat
      d = st.cost * stretch
      if t + d > until:  # (the others' share changes on the way)
        d, stretch, until, owed = alu_span(wg, t, st.cost)
        wg.owed += owed
      elif owe:
        wg.owed += st.cost * owe
      wg.time = t + (d if d <= 0 or eng.tc_free <= t else
                     tensor_overlap(d, eng.tc_free - t, st.beside))
      if st.multi:
        for o, v in zip(st.outs, out):
          env[o] = v
      elif st.outs:
        env[st.outs[0]] = out
  except Exception as e:
    assert st is not None  # (only a step raises here)
    raise _located(e, st.eqn, st.where, wg)
  return [env[i] for i in prog.outvars]


def run_gen(prog: Program, args: Sequence[Any], wg: Warpgroup
            ) -> Generator[Any, Any, list[Any]]:
  """Evaluates a program that may block: a generator yielding wait requests
  (`outs = yield from run_gen(...)`); a program that cannot block runs
  straight through."""
  if not prog.blocking:
    return run_plain(prog, args, wg)
  env = prog.template.copy()
  for i, a in zip(prog.invars, args):
    env[i] = a
  wg.steps += len(prog.steps)  # (counted as a program starts: for progress)
  stretch, until, owe = alu_share(wg, wg.time)
  eng = wg.block.engines
  st: Step | None = None
  try:
    for st in prog.steps:
      if st.gen:
        out = yield from st.fn(wg, *[env[i] for i in st.ins])
        stretch, until, owe = alu_share(wg, wg.time)  # (it waited: the others moved on)
      else:
        out = st.fn(wg, *[env[i] for i in st.ins])
      wg.alu += st.cost
      t = wg.time + st.lat
      d = st.cost * stretch
      if t + d > until:
        d, stretch, until, owed = alu_span(wg, t, st.cost)
        wg.owed += owed
      elif owe:
        wg.owed += st.cost * owe
      wg.time = t + (d if d <= 0 or eng.tc_free <= t else
                     tensor_overlap(d, eng.tc_free - t, st.beside))
      if st.multi:
        for o, v in zip(st.outs, out):
          env[o] = v
      elif st.outs:
        env[st.outs[0]] = out
  except GeneratorExit:
    raise
  except Exception as e:
    assert st is not None  # (only a step raises here)
    raise _located(e, st.eqn, st.where, wg)
  return [env[i] for i in prog.outvars]
