"""The layout's rules, checked on the source: what reads what, and what the
comments may say."""
import ast
import glob
import os
import re
import subprocess
import tokenize

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIM = os.path.join(ROOT, "backends", "sim")


def _tracked(*patterns):
  out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True,
                       text=True, check=True).stdout.split()
  return [os.path.join(ROOT, f) for f in out if os.path.exists(os.path.join(ROOT, f))]


def _comments_and_docstrings(path):
  """(line, text) of every comment and docstring of a Python file."""
  src = open(path).read()
  with open(path, "rb") as f:
    out = [(t.start[0], t.string) for t in tokenize.tokenize(f.readline)
           if t.type == tokenize.COMMENT]
  for node in ast.walk(ast.parse(src)):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      doc = ast.get_docstring(node, clean=False)
      if doc:
        out.append((getattr(node, "lineno", 1), doc))
  return out


_WHEN = re.compile(r"\bissue \d+|\b(first|second|third|fourth|fifth|sixth|seventh|eighth|"
                   r"ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|"
                   r"sixteenth|seventeenth|eighteenth|nineteenth|twentieth|twenty-\w+)"
                   r" session\b", re.I)


def test_comments_say_why_not_when():
  """No comment or docstring in the code names an issue number or a session:
  history lives in git and benchmarks/HISTORY.md. (Data keys that name one,
  a JSON field's name, are data: they are not comments.)"""
  found = []
  for path in _tracked("*.py"):
    for line, text in _comments_and_docstrings(path):
      m = _WHEN.search(text)
      if m:
        found.append(f"{os.path.relpath(path, ROOT)}:{line}: {m.group(0)}")
  assert not found, "\n".join(found)


def test_timing_reads_op_classes_not_primitive_names():
  """The cost model prices what the rules declare (OpClass), so a JAX
  release that renames a primitive cannot change a time."""
  found = []
  for d, _, files in os.walk(os.path.join(SIM, "timing")):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(d, name)
        for i, line in enumerate(open(path), 1):
          if re.search(r"primitive\.name|primitive_name\(", line.split("#")[0]):
            found.append(f"{os.path.relpath(path, ROOT)}:{i}")
  assert not found, found


def test_every_rule_has_an_op_class():
  from pallas_sim.backends.sim.interpret import compiler, rules  # noqa: F401
  from pallas_sim.backends.sim.timing.model import OpClass
  assert compiler.RULES
  assert set(compiler.RULES) <= set(compiler.OP_CLASSES)
  assert all(isinstance(c, OpClass) for c in compiler.OP_CLASSES.values())


@pytest.mark.parametrize("top", ["tests", "benchmarks", "lab"])
def test_nothing_reaches_into_benchmarks_or_the_lab_through_sys_path(top):
  """The lab is a package the tests import (`from lab import calibrate`);
  benchmarks/ holds scripts a user runs."""
  found = []
  for path in _tracked(f"{top}/*.py", f"{top}/**/*.py"):
    for i, line in enumerate(open(path), 1):
      if "sys.path" in line and re.search(r"[\"'](benchmarks|lab)[\"']", line):
        found.append(f"{os.path.relpath(path, ROOT)}:{i}")
  assert not found, found


def test_no_tunable_is_a_module_global_another_module_sets():
  """What the executor runs with is fixed when it is made (Options, Tuning):
  no module assigns another module's global."""
  found = []
  for path in _tracked("pallas_sim/*.py", "backends/**/*.py"):
    tree = ast.parse(open(path).read())
    for node in ast.walk(tree):
      if isinstance(node, ast.Assign):
        for t in node.targets:
          if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
              and t.value.id not in ("self", "cls") and t.attr.isupper()):
            found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {t.value.id}.{t.attr}")
  assert not found, found


def test_the_root_shows_one_api_and_two_backends():
  """The root is the design card's: the API package, the backends beside it
  (installed as pallas_sim.backends), tests, examples, pyproject.toml, tox.ini."""
  for entry in ("pallas_sim", "backends/sim", "backends/mosaic", "tests", "examples",
                "pyproject.toml", "tox.ini"):
    assert os.path.exists(os.path.join(ROOT, entry)), entry
  assert not os.path.exists(os.path.join(ROOT, "pallas_sim", "backends"))


def test_pyproject_lists_every_package_of_the_tree():
  """package-dir maps backends/ to pallas_sim.backends, so setuptools cannot
  find the packages itself: the list in pyproject.toml is the tree's."""
  import tomllib
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    tool = tomllib.load(f)["tool"]["setuptools"]
  assert tool["package-dir"] == {"pallas_sim.backends": "backends"}
  found = set()
  for top, name in (("pallas_sim", "pallas_sim"), ("backends", "pallas_sim.backends")):
    for d, _, files in os.walk(os.path.join(ROOT, top)):
      if "__init__.py" in files and "__pycache__" not in d:
        rel = os.path.relpath(d, os.path.join(ROOT, top))
        found.add(name if rel == "." else name + "." + rel.replace(os.sep, "."))
  assert set(tool["packages"]) == found


# The simulator's stages, top to bottom, between the API above and the
# package's core (errors, GPU models, options, the JAX window) below: each
# imports only what lies below it. The executor runs launches the frontend
# hands it through the executor it registered (capture.push_executor), so the
# frontend never imports it; the base layer is the vocabulary all share.
LAYERS = [
    ["pallas_sim", "pallas_sim.api", "pallas_sim.cli", "pallas_sim.compare"],
    ["pallas_sim.backends.mosaic"],
    ["pallas_sim.backends.sim.execute"],
    ["pallas_sim.backends.sim.frontend"],
    ["pallas_sim.backends.sim.blocks"],
    ["pallas_sim.backends.sim.interpret"],
    ["pallas_sim.backends.sim.mlir"],
    ["pallas_sim.backends.sim.checks"],
    ["pallas_sim.backends.sim.timing"],
    ["pallas_sim.backends.sim.analysis"],
    ["pallas_sim.backends.sim.machine"],
    ["pallas_sim.backends.sim.report"],
    ["pallas_sim.backends.sim.base"],
    ["pallas_sim.errors", "pallas_sim.gpus", "pallas_sim.options", "pallas_sim.jax_window",
     "pallas_sim.present", "pallas_sim.unwritten"],
]


def _modules():
  """{module name: path} of the API package and the backends, by the names
  they install as."""
  out = {}
  for top, name in (("pallas_sim", "pallas_sim"), ("backends", "pallas_sim.backends")):
    for path in _tracked(f"{top}/*.py", f"{top}/**/*.py"):
      rel = os.path.relpath(path, os.path.join(ROOT, top))[:-3].replace(os.sep, ".")
      rel = rel.removesuffix("__init__").rstrip(".")
      out[name + ("." + rel if rel else "")] = path
  return out


def _imports(path, module, known):
  """(line, module) of every import of ours in a file, at any depth (an
  import inside a function is an edge all the same)."""
  is_pkg = path.endswith("__init__.py")
  package = module if is_pkg else module.rpartition(".")[0]
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                 for a in node.names]
    else:
      continue
    for t in targets:
      while t and t not in known:
        t = t.rpartition(".")[0]
      if t:
        yield node.lineno, t


def _layer(module):
  """(index, entry) of the layer `module` belongs to; None for the two
  packages that only hold the backends (no code)."""
  if module in ("pallas_sim.backends", "pallas_sim.backends.sim"):
    return None
  best = None
  for i, names in enumerate(LAYERS):
    for n in names:
      inside = module.startswith(n + ".") and n != "pallas_sim"
      if (module == n or inside) and (best is None or len(n) > len(best[1])):
        best = (i, n)
  return best


def test_stages_import_only_the_layers_below_them():
  """The stages form layers: a module imports its own stage and the stages
  below it, never one above (no loops between stages)."""
  known = _modules()
  found, unplaced = [], []
  for module, path in sorted(known.items()):
    here = _layer(module)
    if here is None:
      if module not in ("pallas_sim.backends", "pallas_sim.backends.sim"):
        unplaced.append(module)  # (a new stage: give it its place above)
      continue
    for line, target in _imports(path, module, known):
      there = _layer(target)
      if there is None or there[0] >= here[0]:
        continue
      found.append(f"{os.path.relpath(path, ROOT)}:{line}: {here[1]} imports {target}")
  assert not unplaced, unplaced
  assert not found, "\n".join(found)


def test_the_layer_test_sees_an_import_that_runs_back_up(tmp_path):
  """The check itself: an import of a higher stage, even inside a function,
  is found."""
  src = tmp_path / "m.py"
  src.write_text("def f():\n  from pallas_sim.backends.sim.execute import executor\n")
  known = _modules()
  got = list(_imports(str(src), "pallas_sim.backends.sim.machine.m", known))
  assert got == [(2, "pallas_sim.backends.sim.execute.executor")]
  assert _layer(got[0][1])[0] < _layer("pallas_sim.backends.sim.machine.m")[0]


# Private names of ours a test may still reach, by (test file, access):
# none; a test that needs an internal names a documented seam instead.
_PRIVATE_REACH_ALLOWED: set[tuple[str, str]] = set()


def _private(name):
  return name.startswith("_") and not name.startswith("__")


def _private_reach(src):
  """(line, access) of each private name (one leading underscore) of ours a
  test reaches: `from pallas_sim... import _name`, an attribute `X._name`
  of a name X imported from pallas_sim (a module or class of ours), and
  setattr/getattr/delattr (monkeypatch's too) of such an X by a "_name"
  string, or of a "pallas_sim...._name" target."""
  tree = ast.parse(src)
  ours, found = set(), []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pallas_sim":
      for part in node.module.split("."):
        if _private(part):
          found.append((node.lineno, node.module))
      for a in node.names:
        ours.add(a.asname or a.name)
        if _private(a.name):
          found.append((node.lineno, f"from {node.module} import {a.name}"))
    elif isinstance(node, ast.Import):
      for a in node.names:
        if a.name.split(".")[0] == "pallas_sim":
          ours.add(a.asname or "pallas_sim")
          if any(_private(part) for part in a.name.split(".")):
            found.append((node.lineno, f"import {a.name}"))

  def of_ours(node):
    while isinstance(node, ast.Attribute):
      node = node.value
    return isinstance(node, ast.Name) and node.id in ours

  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and _private(node.attr) and of_ours(node.value):
      found.append((node.lineno, ast.unparse(node)))
    elif isinstance(node, ast.Call) and node.args:
      f = node.func
      name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
      if name not in ("setattr", "getattr", "delattr", "hasattr"):
        continue
      first, second = node.args[0], node.args[1] if len(node.args) > 1 else None
      if (isinstance(second, ast.Constant) and isinstance(second.value, str)
          and _private(second.value) and of_ours(first)):
        found.append((node.lineno, f"{ast.unparse(first)}.{second.value}"))
      elif (isinstance(first, ast.Constant) and isinstance(first.value, str)
            and first.value.split(".")[0] == "pallas_sim"
            and any(_private(part) for part in first.value.split("."))):
        found.append((node.lineno, first.value))
  return sorted(set(found))


def _test_files():
  """The product's tests and the lab's (lab/tests: its tools' own)."""
  return sorted(p for top in (("tests",), ("lab", "tests"))
                for p in glob.glob(os.path.join(ROOT, *top, "**", "*.py"), recursive=True)
                if "__pycache__" not in p)


def test_tests_reach_no_private_names_of_the_product():
  """Tests go through public seams: where a unit test needs an internal,
  the internal is a named, documented function of its module, not reached
  by an underscore name (which a refactor may rename or drop unseen)."""
  found = []
  for path in _test_files():
    rel = os.path.relpath(path, ROOT)
    for line, access in _private_reach(open(path).read()):
      if (rel, access) not in _PRIVATE_REACH_ALLOWED:
        found.append(f"{rel}:{line}: {access}")
  assert not found, "\n".join(found)


def test_the_private_name_test_sees_each_way_of_reaching_one():
  """The check itself: every form is found; a private name of our own test
  module, or of another package, is not."""
  src = ("import pallas_sim.backends.sim.checks.races as races\n"
         "from pallas_sim.backends.sim.interpret.rules.tma import _run\n"
         "from pallas_sim.backends.sim.execute.executor import Executor\n"
         "import numpy as np\n"
         "races.Tracker._check(1)\n"
         "monkeypatch.setattr(Executor, '_go', None)\n"
         "monkeypatch.setattr('pallas_sim.gpus._TABLE', {})\n"
         "np._private, _local = 1, 2\n"
         "races.Tracker.access(1)\n")
  assert [line for line, _ in _private_reach(src)] == [2, 5, 6, 7]


# The parameters that hold an equation's bodies, as JAX binds them.
_BODY_PARAMS = {"jaxpr", "jaxprs", "branches", "cond_jaxpr", "body_jaxpr", "call_jaxpr"}


def test_one_walker_reads_the_bodies_of_equations():
  """analysis/walker.py is the one place that knows which parameter holds
  which body (its `structure`): every other pass asks it, so a new
  control-flow primitive is one change. Two reads stay outside, each for a
  reason of its own: the source location of a kernel's body (base/, below
  the walker) and the frontend unpacking an mpmd_map into a pallas_call's
  parameters (a launch's parameters, not a body it walks)."""
  allowed = {("backends/sim/base/locations.py", "jaxpr"),
             ("backends/sim/frontend/capture.py", "jaxprs"),
             ("backends/sim/frontend/capture.py", "jaxpr")}
  found = []
  for path in _tracked("backends/**/*.py"):
    rel = os.path.relpath(path, ROOT)
    if rel == "backends/sim/analysis/walker.py":
      continue
    for node in ast.walk(ast.parse(open(path).read())):
      key = None
      if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        key = node.slice.value
      elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop") and node.args
            and isinstance(node.args[0], ast.Constant)):
        key = node.args[0].value
      elif isinstance(node, ast.Name) and node.id == "jaxprs_in_params":
        key = node.id
      elif isinstance(node, ast.Attribute) and node.attr == "jaxprs_in_params":
        key = node.attr
      if (key in _BODY_PARAMS or key == "jaxprs_in_params") and (
          (rel, key) not in allowed):
        found.append(f"{rel}:{node.lineno}: {key}")
  assert not found, "\n".join(found)
