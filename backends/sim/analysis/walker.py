"""The one walk over a kernel's jaxpr that every pass shares. What control
flow and calls do with their operands is known here once: which bodies an
equation holds (`structure`, the one sub-jaxpr table), which operands a
cond's branches, a while loop's condition and body, a scan's body and a
run_scoped or called body take, and where their results go. Adding a
control-flow primitive is a change here.

Passes that only need every equation, at any depth, use `equations` (or
`jaxprs`); passes that rewrite bodies use `replace_bodies`. An abstract
interpretation supplies its domain and the transfer function of every other
primitive: `Forward` runs values from operands to results (block_classes:
what each value depends on; congruence: what integers are multiples of, and
their bounds; smem_swizzle: which allocation a ref names). `Backward` runs
needs from results to operands (paths: the slice of the kernel that its
control decisions and TMA loads need). The compiler's control-flow rules
(interpret/rules/control_flow.py) take their bodies from `structure` too."""
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, NoReturn, TypeVar

from jax.extend import core as jax_extend_core

from pallas_sim.backends.sim.base import jax_internals as jx

Jaxpr = Any   # jax's jaxpr, open or closed (jax_internals.Jaxpr)
Eqn = Any     # one of its equations
V = TypeVar("V")

# Primitives whose body just runs on the equation's operands by position
# (paths slices through them; through other bodies, a core or warp map's,
# it does not), by the parameter that holds the body, in every release of
# the JAX window (0.12 calls a closed call eval_jaxpr, and checkpoint remat2).
CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr",
         "core_call": "call_jaxpr", "eval_jaxpr": "call_jaxpr",
         "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr",
         "custom_vjp_call_jaxpr": "call_jaxpr", "custom_vmap_call": "call",
         "checkpoint": "jaxpr", "remat": "jaxpr", "remat2": "jaxpr"}


def inner(j: Jaxpr) -> Jaxpr:
  """The open Jaxpr of a ClosedJaxpr (or the Jaxpr itself)."""
  return j.jaxpr if hasattr(j, "consts") else j


def _is_jaxpr(value: Any) -> bool:
  """Whether an equation parameter is a jaxpr, open or closed."""
  return hasattr(value, "eqns") or hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns")


def given_jaxprs(value: Any) -> Iterator[Jaxpr]:
  """The jaxprs an equation parameter holds (nested in tuples or lists), as
  it holds them: closed ones with their consts."""
  if _is_jaxpr(value):
    yield value
  elif isinstance(value, (tuple, list)):
    for v in value:
      yield from given_jaxprs(v)


def scan_counts(eqn: Eqn) -> tuple[int, int] | None:
  """(consts, carries) of a lax.scan equation's inputs (the xs follow), or
  None where its parameters say neither (jax 0.11 packs the three groups
  in a flat tree, ft_in; older ones count them)."""
  p = eqn.params
  if "num_consts" in p:
    return p["num_consts"], p["num_carry"]
  ft = p.get("ft_in")
  groups: Sequence[Any] = ft.unpack() if hasattr(ft, "unpack") else ()
  if len(groups) != 3 or sum(map(len, groups)) != len(eqn.invars):
    return None
  return len(groups[0]), len(groups[1])


@dataclasses.dataclass(frozen=True)
class Cond:
  """cond(index, *operands): the branch `index` picks runs on the operands."""
  visit: ClassVar[str] = "cond"
  branches: tuple[Jaxpr, ...]
  given: tuple[Jaxpr, ...] = ()  # (the branches as the equation holds them)

  @property
  def bodies(self) -> tuple[Jaxpr, ...]:
    return self.branches


@dataclasses.dataclass(frozen=True)
class While:
  """while(*cond consts, *body consts, *carry): the condition runs on its
  consts and the carry, the body on its consts and the carry, which it
  gives back."""
  visit: ClassVar[str] = "loop"
  cond: Jaxpr
  body: Jaxpr
  cond_consts: int
  body_consts: int
  given: tuple[Jaxpr, ...] = ()  # (condition, body) as the equation holds them

  @property
  def bodies(self) -> tuple[Jaxpr, ...]:
    return (self.cond, self.body)

  def split(self, ins: Sequence[V]) -> tuple[list[V], list[V], list[V]]:
    """(condition consts, body consts, carry), as lists."""
    cn, bn = self.cond_consts, self.body_consts
    return list(ins[:cn]), list(ins[cn:cn + bn]), list(ins[cn + bn:])


@dataclasses.dataclass(frozen=True)
class Scan:
  """scan(*consts, *carry, *xs): the body runs on the consts, the carry and
  an element of each xs, and gives back the carry and an element of each
  ys. `counts`: (consts, carries), None where the parameters say neither."""
  visit: ClassVar[str] = "scan"
  body: Jaxpr
  counts: tuple[int, int] | None
  length: int | None
  given: tuple[Jaxpr, ...] = ()  # (the body as the equation holds it,)

  @property
  def bodies(self) -> tuple[Jaxpr, ...]:
    return (self.body,)

  def split(self, ins: Sequence[V]) -> tuple[list[V], list[V], list[V]]:
    """(consts, carry, xs), as lists; the counts must be known."""
    if self.counts is None:
      raise ValueError("a scan whose parameters count neither its consts nor its carry")
    nc, ncar = self.counts
    return list(ins[:nc]), list(ins[nc:nc + ncar]), list(ins[nc + ncar:])


@dataclasses.dataclass(frozen=True)
class RunState:
  """pl.run_state(*operands): the body's refs hold the operands' values
  (refs passed in stay the same memory)."""
  visit: ClassVar[str] = "run_state"
  body: Jaxpr
  given: tuple[Jaxpr, ...] = ()

  @property
  def bodies(self) -> tuple[Jaxpr, ...]:
    return (self.body,)


@dataclasses.dataclass(frozen=True)
class Call:
  """Bodies run on the operands. `kind`: "scoped" (run_scoped: the body
  takes what it closes over as constvars, then its allocations), "call"
  (CALLS: by position) or "map" (a core or warp map, and anything else
  that holds jaxprs)."""
  visit: ClassVar[str] = "call"
  bodies: tuple[Jaxpr, ...]
  kind: str
  given: tuple[Jaxpr, ...] = ()  # (the bodies as the equation holds them)

  def inputs(self, body: Jaxpr, ins: Sequence[V], fresh: V, mixed: V) -> list[V]:
    """What `body` takes: a scope's closed-over operands and `fresh` for
    its allocations; the operands by position where their counts agree;
    else `mixed` (any of the operands) for every input."""
    if self.kind == "scoped":
      return list(ins[:len(body.constvars)]) + [fresh] * len(body.invars)
    if len(ins) == len(body.invars):
      return list(ins)
    return [mixed] * (len(body.constvars) + len(body.invars))


# An equation's structure: what it runs its bodies on.
Form = Cond | While | Scan | RunState | Call


# id(eqn) -> (eqn, its form): a launch's analyses walk the same equations
# several times (each analysis, and a loop's body until it holds); bounded,
# as it keeps the equations alive.
_FORMS: dict[int, tuple[Eqn, Form | None]] = {}
_FORMS_KEPT = 8192


def structure(eqn: Eqn) -> Form | None:
  """eqn's control flow or call (a form above, whose `visit` names the
  walkers' method for it), or None for a primitive without bodies."""
  hit = _FORMS.get(id(eqn))
  if hit is not None and hit[0] is eqn:
    return hit[1]
  if len(_FORMS) >= _FORMS_KEPT:
    _FORMS.clear()
  form = _FORMS[id(eqn)] = (eqn, _structure(eqn))
  return form[1]


def _structure(eqn: Eqn) -> Form | None:
  name = eqn.primitive.name
  p = eqn.params
  if name == "cond":
    given = tuple(p["branches"])
    return Cond(tuple(map(inner, given)), given)
  if name == "while":
    given = (p["cond_jaxpr"], p["body_jaxpr"])
    return While(inner(given[0]), inner(given[1]), p["cond_nconsts"], p["body_nconsts"],
                 given)
  if name == "scan":
    return Scan(inner(p["jaxpr"]), scan_counts(eqn), p.get("length"), (p["jaxpr"],))
  if name == "run_state":
    return RunState(inner(p["jaxpr"]), (p["jaxpr"],))
  if name in CALLS:
    given = tuple(given_jaxprs(jx.param(eqn, CALLS[name])))
    others = tuple(g for k, v in p.items() if k != CALLS[name] for g in given_jaxprs(v))
    return Call(tuple(map(inner, given + others)), "call", given + others)
  given = tuple(g for v in p.values() for g in given_jaxprs(v))
  if not given:
    return None
  return Call(tuple(map(inner, given)), "scoped" if name == "run_scoped" else "map", given)


F = TypeVar("F", Cond, While, Scan, RunState, Call)


def is_warp_map(eqn: Eqn) -> bool:
  """Whether eqn is warp-level code inside a kernel (plgpu.warp_map, or a
  core_map over a plgpu.WarpMesh): an mpmd_map over one WarpMesh, whose body
  each warp runs on the operands by position."""
  if eqn.primitive is not jx.mpmd.mpmd_map_p:
    return False
  meshes, given = eqn.params.get("meshes", ()), bodies(eqn)
  return (len(meshes) == 1 and isinstance(meshes[0], jx.gpu_core.WarpMesh)
          and len(given) == 1 and not given[0].constvars
          and len(given[0].invars) == len(eqn.invars))


def form_of(eqn: Eqn, kind: type[F]) -> F:
  """structure(eqn), which a rule for its primitive knows is a `kind`."""
  form = structure(eqn)
  if not isinstance(form, kind):
    raise TypeError(f"{eqn.primitive.name}: its structure is {form!r}, not a {kind.__name__}")
  return form


def bodies(eqn: Eqn) -> tuple[Jaxpr, ...]:
  """The open jaxprs `eqn` holds (none for a primitive without bodies)."""
  form = structure(eqn)
  return () if form is None else form.bodies


def jaxprs(jaxpr: Jaxpr) -> Iterator[Jaxpr]:
  """`jaxpr` and every jaxpr nested in it, each once, outer before inner."""
  seen, stack = set(), [inner(jaxpr)]
  while stack:
    j = stack.pop()
    if id(j) in seen:
      continue
    seen.add(id(j))
    yield j
    for eqn in j.eqns:
      stack.extend(reversed(bodies(eqn)))


def equations(jaxpr: Jaxpr) -> Iterator[Eqn]:
  """Every equation of `jaxpr` and of the jaxprs nested in it (each body once)."""
  for j in jaxprs(jaxpr):
    yield from j.eqns


def replace_bodies(params: dict[str, Any], fn: Callable[[Jaxpr], Jaxpr]
                   ) -> dict[str, Any]:
  """`params` with each jaxpr it holds (closed or open, nested in tuples)
  replaced by fn(jaxpr); the same dict where fn changed none."""
  def one(v: Any) -> Any:
    if _is_jaxpr(v):
      return fn(v)
    if isinstance(v, tuple) and any(True for _ in given_jaxprs(v)):
      new = tuple(map(one, v))
      return v if all(a is b for a, b in zip(new, v)) else new
    return v
  new = {k: one(v) for k, v in params.items()}
  return params if all(new[k] is v for k, v in params.items()) else new


def bind(jaxpr: Jaxpr, ins: Sequence[V]) -> Iterator[tuple[Any, V]]:
  """A jaxpr's input variables for `ins`: its invars, or where there are
  more values, its constvars and then its invars (a run_scoped body takes
  what it closes over as constvars, bound before its invars:
  interpret/compiler.py compile_open)."""
  names = list(jaxpr.invars)
  if len(ins) != len(names):
    names = list(jaxpr.constvars) + names
  return zip(names, ins)


class Forward:
  """An abstract interpretation that runs forward: the values of a jaxpr's
  outputs from its inputs'. A subclass gives its domain: `unknown` (a
  variable nothing is known of), `literal`, `join` (what both values
  allow), `widen` (a loop carry's next guess), `mixed` (a value that may
  be any of several) and `transfer` (a primitive without bodies); and may
  note decisions (`branch_index`, `trip_count`). Loops run to a fixpoint
  of `widen`."""

  unknown: Any = None  # (a domain's value nothing is known of)

  def literal(self, v: Any) -> Any:
    return self.unknown

  def join(self, a: Any, b: Any) -> Any:
    raise NotImplementedError

  def widen(self, old: Any, new: Any) -> Any:
    return self.join(old, new)

  def mixed(self, values: Sequence[Any]) -> Any:
    return self.unknown

  def result(self, var: Any, value: Any) -> Any:
    """What `var`, an equation's result, holds: `value` (a domain may add
    to it, by its type)."""
    return value

  def transfer(self, eqn: Eqn, ins: list[Any]) -> Sequence[Any]:
    raise NotImplementedError

  def branch_index(self, eqn: Eqn, index: Any) -> None:
    """A cond picks its branch by `index` (the value of its first operand)."""

  def trip_count(self, eqn: Eqn, cond_outs: list[Any]) -> None:
    """A while loop's trip count is decided by `cond_outs` (the values of
    its condition's outputs, once the carry is at its fixpoint)."""

  def walk(self, jaxpr: Jaxpr, ins: Sequence[Any]) -> list[Any]:
    env = dict(bind(jaxpr, ins))
    literal, unknown = self.literal, self.unknown

    def get(v: Any) -> Any:
      if isinstance(v, jax_extend_core.Literal):
        return literal(v)
      return env.get(v, unknown)

    # (the dispatch is inline, not a method: each frame a nested jaxpr adds
    # to the walk's recursion costs CPython's frame stack a 16 KiB chunk
    # mapped and unmapped wherever the recursion crosses a chunk's end)
    entering, leaving = self.entering, self.leaving
    for eqn in jaxpr.eqns:
      ins = [get(v) for v in eqn.invars]
      form = structure(eqn)
      entering(eqn, ins)
      outs = (self.transfer(eqn, ins) if form is None else
              getattr(self, form.visit)(eqn, form, ins))
      leaving(eqn)
      for v, x in zip(eqn.outvars, outs):
        env[v] = self.result(v, x)
    return [get(v) for v in jaxpr.outvars]

  def entering(self, eqn: Eqn, ins: list[Any]) -> None:
    """Before eqn's results are found from its operands' values `ins`."""

  def leaving(self, eqn: Eqn) -> None:
    """After (not where the walk raised)."""

  def cond(self, eqn: Eqn, form: Cond, ins: list[Any]) -> list[Any]:
    """Any branch's results: joined over the branches."""
    self.branch_index(eqn, ins[0])
    outs: list[Any] = []
    for i, branch in enumerate(form.branches):
      res = self.walk(branch, ins[1:])
      outs = res if i == 0 else [self.join(a, b) for a, b in zip(outs, res)]
    return outs

  def loop(self, eqn: Eqn, form: While, ins: list[Any]) -> list[Any]:
    """The carry, widened by what the body gives back until it holds."""
    cc, bc, carry = form.split(ins)
    while True:
      new = [self.widen(c, t) for c, t in zip(carry, self.walk(form.body, bc + carry))]
      if new == carry:
        break
      carry = new
    self.trip_count(eqn, self.walk(form.cond, cc + carry))
    return carry

  def scan(self, eqn: Eqn, form: Scan, ins: list[Any]) -> list[Any]:
    """Each carry widened by what the body gives back in its place until it
    holds; the xs and ys as they are. Where the operands' roles are not
    known, every output may feed every input (_feedback)."""
    if form.counts is None:
      return self._feedback(eqn, form.body, ins)
    consts, carry, xs = form.split(ins)
    ncar = len(carry)
    while True:
      res = self.walk(form.body, consts + carry + xs)
      new = [self.widen(c, t) for c, t in zip(carry, res[:ncar])]
      if new == carry:
        return carry + res[ncar:]
      carry = new

  def _feedback(self, eqn: Eqn, body: Jaxpr, ins: list[Any]) -> list[Any]:
    """A loop over `body` whose outputs all feed back into all its inputs,
    until they hold."""
    sub_in = Call((body,), "call").inputs(body, ins, self.unknown, self.mixed(ins))
    while True:
      res = self.walk(body, sub_in)
      back = self.mixed(res)
      grown = [self.join(t, back) for t in sub_in]
      if grown == sub_in:
        break
      sub_in = grown
    return self.returned(eqn, ins, [res])

  def run_state(self, eqn: Eqn, form: RunState, ins: list[Any]) -> list[Any]:
    """By default, a call of its body on the operands."""
    return self.call(eqn, Call((form.body,), "call"), ins)

  def call(self, eqn: Eqn, form: Call, ins: list[Any]) -> list[Any]:
    mixed = self.mixed(ins)
    return self.returned(eqn, ins, [
        self.walk(body, form.inputs(body, ins, self.unknown, mixed))
        for body in form.bodies])

  def returned(self, eqn: Eqn, ins: list[Any], results: list[list[Any]]) -> list[Any]:
    """eqn's results from its bodies' (`results`, a list of values per
    body): a body's by position where it gives as many, else any of its
    results and the operands; joined over the bodies."""
    n = len(eqn.outvars)
    outs: list[Any] = []
    for i, res in enumerate(results):
      got = res if len(res) == n else [self.mixed(list(res) + list(ins))] * n
      outs = got if i == 0 else [self.join(a, b) for a, b in zip(outs, got)]
    return outs


def any_of(*lists: Sequence[bool]) -> list[bool]:
  """Elementwise `or` of lists of flags (as long as the shortest)."""
  return [any(t) for t in zip(*lists)]


class Backward:
  """A slice that runs backward: walking a jaxpr from its outputs, which of
  its equations are needed and which of their operands each needs
  (`kept`: id(equation) -> a flag per operand). Every control decision is
  in it (a cond's branch index, a while loop's condition) with what it
  needs; a subclass says which other equations are (`transfer`: the
  operands' flags, or None for an equation left out), what its slice is
  for in words (`KEEPS`), and how it refuses what it cannot slice
  (`refuse`)."""

  KEEPS = "a decision"

  def __init__(self) -> None:
    self.kept: dict[int, list[bool]] = {}

  def transfer(self, eqn: Eqn, outs: list[bool]) -> list[bool] | None:
    raise NotImplementedError

  def refuse(self, why: str) -> NoReturn:
    raise NotImplementedError

  def walk(self, jaxpr: Jaxpr, out_need: Sequence[bool]) -> tuple[list[bool], bool]:
    """Marks the equations of `jaxpr` needed for its outputs where
    out_need says so, and for every decision inside it; returns, for its
    constvars then its invars, whether each is needed, and whether any of
    its equations is."""
    need = {v for v, n in zip(jaxpr.outvars, out_need)
            if n and not isinstance(v, jax_extend_core.Literal)}
    kept = False
    for eqn in reversed(jaxpr.eqns):
      ins = self.equation(eqn, [v in need for v in eqn.outvars])
      if ins is None:
        continue
      prev = self.kept.get(id(eqn))  # (a loop's body is sliced again as its needs grow)
      self.kept[id(eqn)] = ins if prev is None else any_of(prev, ins)
      kept = True
      for v, n in zip(eqn.invars, ins):
        if n and not isinstance(v, jax_extend_core.Literal):
          need.add(v)
    return [v in need for v in list(jaxpr.constvars) + list(jaxpr.invars)], kept

  def body(self, jaxpr: Jaxpr, out_need: Sequence[bool], consts: bool = False
           ) -> tuple[list[bool], bool]:
    """walk of a nested jaxpr whose inputs are the equation's operands (its
    invars; its constvars where `consts`, a run_scoped body's): the need
    of each operand, and whether anything inside is kept."""
    flags, kept = self.walk(jaxpr, out_need)
    nc = len(jaxpr.constvars)
    return (flags[:nc] if consts else flags[nc:]), kept

  def equation(self, eqn: Eqn, outs: list[bool]) -> list[bool] | None:
    """Whether each operand of `eqn` is needed, or None when eqn is not."""
    form = structure(eqn)
    if form is None:
      return self.transfer(eqn, outs)
    visit: Callable[..., list[bool] | None] = getattr(self, form.visit)
    return visit(eqn, form, outs)

  def cond(self, eqn: Eqn, form: Cond, outs: list[bool]) -> list[bool] | None:
    """A decision: which branch's work the block does."""
    ins = [False] * (len(eqn.invars) - 1)
    for branch in form.branches:
      ins = any_of(ins, self.body(branch, outs)[0])
    return [True] + ins

  def loop(self, eqn: Eqn, form: While, outs: list[bool]) -> list[bool] | None:
    cn, bn = form.cond_consts, form.body_consts
    carry = list(outs)
    bflags, _ = self.body(form.body, carry)
    cflags, _ = self.body(form.cond, [True])  # (its trip count is a decision)
    while True:
      grown = any_of(carry, cflags[cn:], bflags[bn:])
      if grown == carry:
        break
      carry = grown
      bflags, _ = self.body(form.body, carry)
    return cflags[:cn] + bflags[:bn] + carry

  def scan(self, eqn: Eqn, form: Scan, outs: list[bool]) -> list[bool] | None:
    if form.counts is None:
      self.refuse("a scan whose parameters count neither its consts nor its carry")
    nc, ncar = form.counts
    carry = list(outs[:ncar])
    flags, kept = self.body(form.body, carry + list(outs[ncar:]))
    if not kept and not any(outs):
      return None
    while True:
      grown = any_of(carry, flags[nc:nc + ncar])
      if grown == carry:
        break
      carry = grown
      flags, _ = self.body(form.body, carry + list(outs[ncar:]))
    return flags[:nc] + any_of(carry, flags[nc:nc + ncar]) + flags[nc + ncar:]

  def run_state(self, eqn: Eqn, form: RunState, outs: list[bool]) -> list[bool] | None:
    """By default, a call of its body on the operands."""
    return self.call(eqn, Call((form.body,), "call"), outs)

  def call(self, eqn: Eqn, form: Call, outs: list[bool]) -> list[bool] | None:
    """A scope's or a call's body is sliced through; a map's bodies must
    hold nothing the slice keeps."""
    name = eqn.primitive.name
    if form.kind == "map" and is_warp_map(eqn):
      # (each warp runs the body on the operands by position, with its own
      # index on the warp axis: a call, to the slice)
      form = Call(form.bodies, "call", form.given)
    if form.kind == "map":  # (left out only where nothing inside matters)
      for body in form.bodies:
        _, kept = self.body(body, [False] * len(body.outvars))
        if kept or any(outs):
          self.refuse(f"{self.KEEPS} inside '{name}'")
      return None
    if len(form.bodies) != 1:
      self.refuse(f"'{name}' with {len(form.bodies)} bodies")
    flags, kept = self.body(form.bodies[0], outs, consts=form.kind == "scoped")
    if len(flags) != len(eqn.invars):
      self.refuse(f"'{name}' whose body does not take its operands")
    return flags if kept or any(outs) else None
