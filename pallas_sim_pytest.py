"""pytest plugin, registered by installing pallas-sim (a module beside the
pallas_sim package, so that loading it imports nothing of JAX's).

* `pytest --pallas-sim`: every Mosaic GPU kernel a test launches runs in the
  simulator with race and uninitialized-memory checks; a test whose kernels
  race, read memory nothing wrote, leave outputs unwritten or deadlock
  fails, with the report in its failure message
  (`--pallas-sim-uninitialized report`, `--pallas-sim-races report`: those
  findings are warnings instead). Races inside jax's own code are warnings
  unless `--pallas-sim-library-races fail`. (Calls that ask for backend="mosaic" explicitly still
  go to the real lowering.)
* `--pallas-sim-present-gpu`: for the whole session, from collection on,
  device queries see the `--pallas-sim-gpu` model (ps.present_gpu), so that
  a kernel library's own tests pick their Mosaic GPU kernels on a CPU.
* The `gpu` marker: such tests are skipped where no Hopper GPU is present.
"""
import pytest

# Why pallas-sim could not be imported (a JAX outside its tested window:
# jax_window.UnsupportedJaxError). The plugin is loaded by every pytest run
# in the environment, so it says so only to runs that ask for it.
_unavailable = []


def _gpu_names():
  try:
    from pallas_sim import gpus
  except ImportError as e:
    _unavailable.append(e)
    return ("h100", "h200")
  return gpus.NAMES


def pytest_addoption(parser):
  group = parser.getgroup("pallas-sim")
  group.addoption("--pallas-sim", action="store_true", default=False,
                  help="run every Mosaic GPU kernel the tests launch in the "
                       "pallas-sim simulator, with race and deadlock checks")
  group.addoption("--pallas-sim-gpu", default="h100", choices=_gpu_names(),
                  help="GPU model for --pallas-sim (default h100)")
  group.addoption("--pallas-sim-races", default="fail", choices=("fail", "report"),
                  help="races fail the test (default) or are reported as warnings")
  group.addoption("--pallas-sim-library-races", default="report",
                  choices=("report", "fail"),
                  help="races inside jax's own code (both accesses in the jax "
                       "package) are warnings (default) or fail the test")
  group.addoption("--pallas-sim-present-gpu", action="store_true", default=False,
                  help="with --pallas-sim: device queries (platform, device_kind, "
                       "compute_capability, core_count, jax.default_backend()) see "
                       "the --pallas-sim-gpu model for the whole session, so that "
                       "libraries that choose kernels by the device pick their "
                       "Mosaic GPU ones")
  group.addoption("--pallas-sim-max-cycles", type=float, default=None,
                  help="stop a block that runs past this many simulated cycles (a "
                       "loop that does not end), failing its test (default 2**32)")
  group.addoption("--pallas-sim-uninitialized", default="fail",
                  choices=("fail", "report"),
                  help="uninitialized reads and unwritten outputs fail the test "
                       "(default) or are reported as warnings")


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "gpu: needs a CUDA Hopper GPU (sm_90); skipped elsewhere")
  if _unavailable and config.getoption("--pallas-sim"):
    raise pytest.UsageError(f"--pallas-sim: {_unavailable[0]}")
  if config.getoption("--pallas-sim-present-gpu"):
    if not config.getoption("--pallas-sim"):
      raise pytest.UsageError("--pallas-sim-present-gpu needs --pallas-sim (the "
                              "kernels must run in the simulator)")
    import contextlib

    import pallas_sim as ps
    stack = config._pallas_sim_present = contextlib.ExitStack()
    stack.enter_context(ps.present_gpu(config.getoption("--pallas-sim-gpu")))


def pytest_unconfigure(config):
  stack = getattr(config, "_pallas_sim_present", None)
  if stack is not None:
    stack.close()


def pytest_collection_modifyitems(config, items):
  gpu_items = [item for item in items if "gpu" in item.keywords]
  if not gpu_items:
    return
  if _unavailable:
    skip = pytest.mark.skip(reason=f"pallas-sim unavailable: {_unavailable[0]}")
  else:
    from pallas_sim.backends import mosaic
    if mosaic.hopper_device() is not None:
      return
    skip = pytest.mark.skip(reason="needs a CUDA Hopper GPU (sm_90)")
  for item in gpu_items:
    item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
  if not item.config.getoption("--pallas-sim"):
    return (yield)
  __tracebackhide__ = True
  # A hypothesis test runs each example in a simulation of its own: what an
  # example's kernels get wrong fails that example, which hypothesis then
  # shrinks, and no example's findings are told with another's.
  handle = getattr(getattr(item, "obj", None), "hypothesis", None)
  inner = getattr(handle, "inner_test", None)
  if inner is not None:
    import functools

    @functools.wraps(inner)  # (hypothesis names the failing example by it)
    def each_example(*args, **kwargs):
      __tracebackhide__ = True
      with _simulated(item):
        return inner(*args, **kwargs)
    handle.inner_test = each_example
    try:
      return (yield)
    finally:
      handle.inner_test = inner
  with _simulated(item):
    out = yield
    # A unittest.TestCase's failure reaches pytest through the item, not as
    # an exception through here: raised here, it gives way to the error of
    # a kernel that failed in the test (its outputs were poison), as a
    # plain test's does.
    failures = getattr(item, "_excinfo", None)
    if failures:
      raise failures.pop(0).value
  return out


class _simulated:
  """The kernels launched inside run in the simulator with the session's
  options. Races, uninitialized memory and deadlocks found raise when the
  block ends (with the full report); reported ones are warnings."""

  def __init__(self, item):
    import pallas_sim as ps
    opt = item.config.getoption
    report_unset = opt("--pallas-sim-uninitialized") == "report"
    report_races = opt("--pallas-sim-races") == "report"
    library = "raise" if opt("--pallas-sim-library-races") == "fail" else "report"
    cycles = opt("--pallas-sim-max-cycles")
    self.block = ps.backend("sim", gpu=opt("--pallas-sim-gpu"), library_races=library,
                            on_race="report" if report_races else "raise",
                            on_uninitialized="report" if report_unset else "raise",
                            **({} if cycles is None else {"max_cycles": cycles}))

  def __enter__(self):
    self.report = self.block.__enter__()
    return self.report

  def __exit__(self, *exc):
    __tracebackhide__ = True
    import warnings

    import pallas_sim as ps
    try:
      suppressed = self.block.__exit__(*exc)
    except ps.SimError as e:
      # (with the test's own frames only: not those of JAX, pallas-sim and
      # the context managers it came out of, where pytest would place it)
      from pallas_sim.backends.sim.base import locations
      raise e.with_traceback(locations.own_frames(e.__traceback__))  # (its cause kept)
    if exc[0] is None:
      for r in self.report.races:
        warnings.warn(ps.RaceWarning(str(r)))
      for f in self.report.uninitialized:
        warnings.warn(ps.UninitializedWarning(str(f)))
    return suppressed
