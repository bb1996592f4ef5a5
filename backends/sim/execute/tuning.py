"""The executor's own settings: how it spends this machine's time and
memory, never what a kernel computes or is predicted to take. One frozen
value, given to the Executor when it is made (tests change it to force a
path: every launch over workers, say)."""
import dataclasses


@dataclasses.dataclass(frozen=True)
class Tuning:
  # A launch goes over worker processes when its first groups say the rest
  # would take at least this long here (a fork and its pool cost ~20 ms);
  # 0: always, after the first group.
  parallel_after_s: float = 0.25
  # Clocks tried after the first below the boost clock (clock.py).
  clock_rounds: int = 2
  # Blocks whose timeline goes into the report's trace.
  trace_blocks: int = 2
  # Each group on its own copy of GMEM, its writes applied at the merge in
  # block order (what a run over several processes does; outputs are the
  # same unless blocks race).
  detached_groups: bool = False
  # GMEM race shadows' bytes touched and not yet given back, per shadow,
  # above which their pages go back to the OS (checks/races.py): a page
  # faulted in again costs ~1 us, which released at every group was 10% of
  # a 1024^3 matmul's time. A worker process keeps its share of it
  # (parallel.worker_release_bytes).
  release_bytes: int = 16 << 20
  # A task runs in a worker forked for it alone when the launch's writable
  # GMEM is this large and the task this long: a fork costs ~5 ms here for
  # a parent of 1 GB mapped (an 8192^3 matmul's parent maps 2-3), and the
  # first group's time, which the estimate rests on, includes warm-up.
  fresh_min_bytes: int = 16 << 20
  fresh_task_s: float = 0.25
