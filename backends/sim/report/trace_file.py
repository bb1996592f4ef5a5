"""Report -> Chrome/Perfetto trace events (JSON object format, which
ui.perfetto.dev and chrome://tracing open).

Per kernel launch: a process per SM that ran a traced block ("kernel · SM
s"), a thread track per warpgroup (its waits), and the SM's TMA engine and
tensor cores as async tracks: transfers and wgmma groups overlap, which
thread slices may not. Launches follow one another in time, each as long
as its prediction."""

ASYNC = {"TMA": "TMA engine", "wgmma": "tensor core"}


def async_unit(who):
  """The async unit a trace event's agent names ("block (0,) thread 0 TMA":
  "TMA engine"), or None for a warpgroup's own."""
  return ASYNC.get(who.rsplit(" ", 1)[-1])


def events(report):
  out = []
  t0 = 0.0   # where this launch starts (simulated microseconds)
  ids = 0
  for k_i, k in enumerate(report.kernels):
    us = 1e6 / k.clock_hz
    pids: dict[int, int] = {}

    def pid(sm):
      p = pids.get(sm)
      if p is None:
        p = pids[sm] = 1000 * (k_i + 1) + sm
        out.append({"ph": "M", "pid": p, "name": "process_name",
                    "args": {"name": f"{k.name} #{k_i} · SM {sm}"}})
      return p
    out.append({"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "kernels"}})
    out.append({"ph": "X", "pid": 0, "tid": "launches", "name": k.name,
                "ts": t0, "dur": k.time_s * 1e6,
                "args": {"bound": k.bound, "where": k.where, "grid": str(k.grid)}})
    for number, block, who, name, start, end in k.trace:
      p = pid(number % k.num_sms)
      unit = async_unit(who)
      ts, dur = t0 + start * us, max(end - start, 0) * us
      if unit is not None:
        ids += 1
        base = {"pid": p, "cat": unit, "name": name, "id": ids, "tid": unit}
        out.append({**base, "ph": "b", "ts": ts,
                    "args": {"thread": who.rsplit(" ", 1)[0]}})
        out.append({**base, "ph": "e", "ts": ts + dur})
      else:
        out.append({"ph": "X", "pid": p, "tid": who, "name": name, "ts": ts, "dur": dur})
    t0 += k.time_s * 1e6
  return {"traceEvents": out, "displayTimeUnit": "ns"}
