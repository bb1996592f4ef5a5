"""ps.compare: configurations of a kernel estimated side by side and ranked,
saying which ones the model cannot tell apart rather than ordering them
on differences it does not resolve."""
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from pallas_sim.options import Options
from pallas_sim.backends.sim.report import Report

# Predictions closer than this (relative) are not told apart: about the
# H200's own run-to-run spread, (max - min) / median over 7 batches of one
# kernel, whose median over 673 measured rows is 1.6%
# (lab/data/h200_measured.json, lab/measure_gpu.py).
RESOLUTION = 0.02


@dataclasses.dataclass
class Row:
  name: str
  time_s: float
  report: Report      # its ps.Report
  at_floor: bool      # every kernel's time set by the HBM floor (KernelReport.at_floor)


@dataclasses.dataclass
class Comparison:
  """Rows fastest first, grouped (`groups`, lists of rows): a group holds
  configurations the model does not tell apart, each within `resolution`
  of the group's fastest (no chains: a group never spans more)."""
  rows: list[Row]
  groups: list[list[Row]]
  resolution: float
  # Candidates the simulator refused (an SMEM overflow, a kernel the lowering
  # rejects...), by name: the others are still ranked.
  failed: dict[str, BaseException] = dataclasses.field(default_factory=dict)

  @property
  def ranking(self) -> list[list[str]]:
    """The configurations' names, group by group, fastest first."""
    return [[r.name for r in g] for g in self.groups]

  @property
  def best(self) -> list[str]:
    """The names predicted fastest (more than one where the model cannot
    tell them apart)."""
    return self.ranking[0] if self.groups else []

  def why(self, group: list[Row]) -> str:
    """Why a group of several is not ordered, in words."""
    if all(r.at_floor for r in group):
      return ("the HBM floor sets each one's time: they move about the same bytes, and "
              "the model does not rank them")
    return (f"predicted within {self.resolution:.0%} of the fastest of them: closer "
            "than the H200's own run-to-run spread")

  def short_writes(self) -> dict[str, float]:
    """The configurations that store fewer bytes than the most any one
    stores (by TMA; a grid that misses part of the output, a tile that does
    not divide it): name -> their share of that. Their time is not the same
    work's."""
    stored = {r.name: sum(k.tma_store_bytes for k in r.report.kernels) for r in self.rows}
    most = max(stored.values(), default=0)
    return {n: b / most for n, b in stored.items() if most and b < most * 0.999}

  def table(self) -> str:
    lines = ["| rank | configuration | predicted (us) | vs fastest | note |",
             "|---:|---|---:|---:|---|"]
    fastest = self.rows[0].time_s if self.rows else 0.0
    short = self.short_writes()
    for rank, g in enumerate(self.groups, 1):
      tie = f"{rank}=" if len(g) > 1 else f"{rank}"
      for k, r in enumerate(g):
        note = ("not told apart: " + self.why(g)) if len(g) > 1 and k == 0 else (
            "at the HBM floor" if r.at_floor and len(g) == 1 else "")
        if r.name in short:
          note = "; ".join(x for x in (note, (
              f"stores {short[r.name]:.1%} of the bytes the most storing one does: "
              "does its grid cover the output?")) if x)
        lines.append(f"| {tie} | {r.name} | {r.time_s * 1e6:.1f} | "
                     f"{r.time_s / fastest:.3f} | {note} |")
    for name, err in self.failed.items():
      first = str(err).splitlines()[0] if str(err) else _first_note(err)
      lines.append(f"| - | {name} | - | - | refused: {type(err).__name__}: {first} |")
    return "\n".join(lines)

  def __str__(self) -> str:
    return self.table()


def _first_note(err: BaseException) -> str:
  """An error without a message: the first of the notes ours added (not
  JAX's about the frames it removed)."""
  from pallas_sim.backends.sim.base import jax_internals as jx
  notes = jx.without_filter_notes(list(getattr(err, "__notes__", ())))
  return notes[0].splitlines()[0] if notes else ""


def compare(candidates: (dict[Any, Callable[..., Any]]
                         | Iterable[tuple[Any, Callable[..., Any]]]),
            *args: Any, resolution: float = RESOLUTION, options: Options | None = None,
            **kwargs: Any) -> Comparison:
  """Estimates each of `candidates` ({name: fn}, or (name, fn) pairs: the
  configurations of one kernel, each a function of the same `args`) as
  ps.estimate does, and ranks them: a Comparison whose `groups` hold the
  configurations the model does not tell apart (predicted within
  `resolution` of each other, by default 2%: the H200's run-to-run spread),
  and whose `table()` says why. A candidate the simulator refuses (SMEM
  overflow, a kernel the lowering rejects, a configuration JAX refuses as
  it traces it) is left out of the ranking and listed in `failed` and the
  table, with its error; where every one is refused, the first one's error
  is raised. Other options as for ps.estimate."""
  from pallas_sim.api import estimate
  if resolution < 0:
    raise ValueError(f"ps.compare: resolution={resolution} must be >= 0")
  items = list(candidates.items() if isinstance(candidates, dict) else candidates)
  if not items:
    raise ValueError("ps.compare: no candidates given")
  rows: list[Row] = []
  failed: dict[str, BaseException] = {}
  for name, fn in items:
    if not callable(fn):
      raise TypeError(f"ps.compare: candidate {name!r} is {type(fn).__name__}, not a "
                      "function")
    try:
      rep = estimate(fn, *args, options=options, **kwargs)
    except Exception as e:  # (this candidate cannot run: the others are still ranked;
      # a bare assertion of JAX's comes with api._simulating's note on it)
      e.add_note(f"(ps.compare's candidate {str(name)!r})")
      failed[str(name)] = e
      continue
    rows.append(Row(str(name), rep.time_s, rep,
                    bool(rep.kernels) and all(k.at_floor for k in rep.kernels)))
  if not rows:  # (every one refused: the first one's reason)
    raise next(iter(failed.values()))
  rows.sort(key=lambda r: r.time_s)
  groups: list[list[Row]] = []
  for r in rows:
    if groups and r.time_s <= groups[-1][0].time_s * (1 + resolution):
      groups[-1].append(r)
    else:
      groups.append([r])
  return Comparison(rows, groups, resolution, failed)
