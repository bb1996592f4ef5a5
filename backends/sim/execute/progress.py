"""Where a running simulation is: a progress line for long launches (also
inside one long block), and the backtrace of every thread of the current
block when the user presses Ctrl-C.

Nothing here costs the interpreter anything per step: a monitor thread
reads the simulating thread's frames (sys._current_frames) every half
second, and a Ctrl-C backtrace reads the frames of the KeyboardInterrupt's
traceback and of each suspended warpgroup's generator chain. Every
`run_plain` / `run_gen` frame holds `st`, the equation it is running; loop
rules hold their counter in `iteration` (interpret/rules/control_flow.py).
"""
import inspect
import os
import sys
import threading
import time

from pallas_sim.backends.sim.interpret import compiler as interpret

_RUNNERS = (interpret.run_plain.__code__, interpret.run_gen.__code__)


def _frame_steps(frames):
  """[(step, iteration or None)] of the interpreter frames among `frames`
  (outermost first); an `iteration` local annotates the loop step above it."""
  out = []
  for fr in frames:
    loc = fr.f_locals
    if fr.f_code in _RUNNERS and "st" in loc and loc["st"] is not None:
      out.append([loc["st"], None])
    elif "iteration" in loc and out:
      out[-1][1] = loc["iteration"]
  return out


def _running_wg(frames):
  """The warpgroup whose program the innermost interpreter frame runs."""
  wg = None
  for fr in frames:
    if fr.f_code in _RUNNERS and "wg" in fr.f_locals:
      wg = fr.f_locals["wg"]
  return wg


def _tb_frames(tb):
  frames = []
  while tb is not None:
    frames.append(tb.tb_frame)
    tb = tb.tb_next
  return frames


def _gen_frames(gen):
  """The frames of a suspended coroutine and those it delegates to."""
  frames = []
  while gen is not None:
    fr = getattr(gen, "gi_frame", None)
    if fr is None:
      break
    frames.append(fr)
    gen = getattr(gen, "gi_yieldfrom", None)
  return frames


def _stack_frames(thread_id):
  """The frames of a running thread, outermost first."""
  fr = sys._current_frames().get(thread_id)
  frames = []
  while fr is not None:
    frames.append(fr)
    fr = fr.f_back
  return frames[::-1]


def _step_text(step, iteration):
  name = step.eqn.primitive.name
  it = f" (iteration {iteration})" if iteration is not None else ""
  return f"{step.where}  {name}{it}"


def backtrace(tasks, exc_tb):
  """Lines saying where each warpgroup of the interrupted group is: the
  running one from the exception's traceback, the others from their
  suspended generators, each with the wait it is blocked in."""
  frames = _tb_frames(exc_tb)
  running, running_wg = _frame_steps(frames), _running_wg(frames)
  lines = []
  for t in tasks:
    if t.done:
      lines.append(f"  {t.name}: finished at cycle {t.time:.0f}")
      continue
    if t is running_wg:
      steps = running
      state = "running"
    else:
      steps = _frame_steps(_gen_frames(t.gen))
      w = t.waiting
      if inspect.getgeneratorstate(t.gen) == inspect.GEN_CREATED:
        state = "not started (a warpgroup runs here until it blocks)"
      elif w is not None and not w.ready():
        state = f"waiting in {w.what} at {w.where}"
      else:
        state = "ready to run"
    lines.append(f"  {t.name}: {state}, at cycle {t.time:.0f}, "
                 f"{t.steps} equations run")
    lines += [f"      {_step_text(st, it)}" for st, it in steps]
  return lines


class Progress:
  """A progress line on stderr for launches running longer than a few
  seconds: blocks done, and inside the current block the simulated cycles,
  equations run and the line being run. `on` (Options.progress): True,
  False, or None for on a terminal, not under CI."""

  def __init__(self, name, total, after_s=3.0, every_s=0.5, stream=None, on=None):
    self.name, self.total, self.after, self.every = name, total, after_s, every_s
    self.stream = stream or sys.stderr
    self.on = on if on is not None else (self.stream.isatty()
                                         and not os.environ.get("CI"))
    self.done = 0          # blocks finished (the executor sets it)
    self.tasks = ()        # the current group's warpgroups (idem)
    self.shown = False
    self._stop = threading.Event()
    self._thread = None
    self._sim = threading.get_ident()
    self.t0 = time.perf_counter()

  def __enter__(self):
    if self.on:
      self._thread = threading.Thread(target=self._loop, daemon=True,
                                      name="pallas-sim progress")
      self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if self.shown:
      self.stream.write("\n")
      self.stream.flush()

  def _loop(self):
    if self._stop.wait(self.after):
      return
    while not self._stop.is_set():
      try:
        line = self.line()
      except Exception:  # a frame changed under us: try again next tick
        line = None
      if line and not self._stop.is_set():
        self.stream.write("\r\x1b[K" + line)
        self.stream.flush()
        self.shown = True
      self._stop.wait(self.every)

  def line(self):
    """The progress text now."""
    el = time.perf_counter() - self.t0
    frac = self.done / self.total if self.total else 0.0
    bar = "#" * int(20 * frac)
    text = (f"[pallas-sim] {self.name}: [{bar:<20}] {self.done}/{self.total} blocks "
            f"{el:.0f}s")
    frames = _stack_frames(self._sim)
    steps, wg = _frame_steps(frames), _running_wg(frames)
    if wg is not None and steps:
      loop = [(st, it) for st, it in steps if it is not None]
      at = _step_text(*(loop[-1] if loop else steps[-1]))
      text += (f"; {wg.name}: cycle {wg.time:.3g}, {wg.steps:,} equations, "
               f"at {at}")
    return text
