"""A launch's findings once its groups merged: race reports and
uninitialized memory into the Report, and the errors they raise
(Options.on_race, on_uninitialized, library_races)."""

from pallas_sim import unwritten
from pallas_sim.backends.sim.base import locations
from pallas_sim.backends.sim.checks import initcheck
from pallas_sim.errors import (OutOfBoundsWarning, RaceError, RaceWarning, UninitializedError,
                               UninitializedWarning)


def conclude(launch, options, report, merge, prep, in_bufs, out_bufs, grid,
             garbage=None):
  """Adds the launch's findings to `report`; returns the errors to raise.
  `garbage`: whether what the launch read uninitialized reaches its outputs
  (Uninitialized.reaches), where that was run; reads that reach none warn
  instead of raising."""
  errors: list[Exception] = []
  found = merge.log.races()
  report.races.extend(found)
  for where, text in merge.outside.items():
    locations.warn_at(OutOfBoundsWarning(f"kernel {launch.name}: {text}"), where)
  for i in sorted(prep.sem_inputs):
    if in_bufs[i].data.any():
      # (the callback holds a copy of the Ref's values: a GPU keeps them)
      locations.warn_at(UserWarning(
          f"kernel {launch.name} leaves semaphores of {in_bufs[i].name} at "
          f"{in_bufs[i].data.tolist()}: the simulator starts every kernel "
          "with the values the Ref held before it (a later kernel here does "
          "not see these, as it would on a GPU)"), launch.where)
  may_stay = unwritten.allowed(launch.name, [b.data for b in in_bufs],
                               [b.data.shape for b in out_bufs], launch.arg_names)
  for buf, ok in zip(out_bufs, may_stay):
    merge.init_log.unwritten_output(buf, grid, ok)
  unset = merge.init_log.findings()
  initcheck.link_causes(unset, found)
  if garbage is not None:
    for f in unset:
      if f.site is not None and f.cause is None:
        f.reaches = garbage
  for f in unset:  # (which launch: a report lists the findings of several)
    f.kernel = f"{launch.name} ({launch.where})"
  report.uninitialized.extend(unset)
  if found and options.on_race == "raise":
    # Races inside jax's own code warn unless library_races="raise".
    strict = options.library_races == "raise"
    mine = [r for r in found if strict or not r.library]
    for r in found:
      if r.library and not strict:
        locations.warn_at(RaceWarning(f"kernel {launch.name}: {r}"), launch.where)
    if mine:
      errors.append(RaceError(
          f"{_counted(mine)} in kernel {launch.name}:\n"
          + "\n".join(str(r) for r in mine) + initcheck.also_found(unset, "races"),
          races=mine, where=launch.where))
  harmful = [f for f in unset if not f.harmless]
  if unset and options.on_uninitialized == "raise":
    for f in unset:
      if f.harmless:
        locations.warn_at(UninitializedWarning(f"kernel {launch.name}: {f}"), launch.where)
  if harmful and options.on_uninitialized == "raise":
    errors.append(UninitializedError(
        f"{len(harmful)} uninitialized-memory finding(s) in kernel {launch.name}:\n"
        + "\n".join(str(f) for f in harmful) + initcheck.also_found(found, "uninitialized"),
        findings=harmful, where=launch.where))
  return errors


def _counted(found):
  """A RaceError's count of what it lists: races (two accesses unordered),
  and synchronization errors that are not (an unawaited TMA store, a lost
  barrier completion, SMEM touched after its block ended...)."""
  races = sum(r.kind.endswith((" race", " race between blocks")) for r in found)
  parts = [f"{races} race(s)"] if races else []
  if len(found) > races:
    parts.append(f"{len(found) - races} synchronization error(s)")
  return " and ".join(parts)
