"""Report -> PNG: the traced blocks' timeline (per warpgroup and async
unit) and a roofline placing each kernel by its tensor-core FLOPs per HBM
byte. matplotlib is the optional extra pallas-sim[plot]."""
from pallas_sim import gpus
from pallas_sim.backends.sim.report.trace_file import async_unit
from pallas_sim.errors import SimError


def _pyplot():
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    raise SimError("report.plot needs matplotlib: pip install 'pallas-sim[plot]' "
                   "(or report.save_trace(path) for a trace without it)") from None
  return plt


def save(report, path):
  plt = _pyplot()
  gpu = gpus.get(report.gpu, report.clock_mhz)
  fig, (tl, roof) = plt.subplots(1, 2, figsize=(14, 5), width_ratios=(3, 2))
  rows: dict[str, int] = {}
  t0 = 0.0
  colors = {"TMA engine": "tab:blue", "tensor core": "tab:orange"}
  for k in report.kernels:
    us = 1e6 / k.clock_hz
    for number, block, who, name, start, end in k.trace:
      row = rows.setdefault(f"{k.name}: {who}", len(rows))
      unit = async_unit(who)
      tl.barh(row, max(end - start, 0) * us, left=t0 + start * us, height=0.6,
              color=colors.get(unit, "tab:gray"), alpha=0.6 if unit in colors else 0.9)
    t0 += k.time_s * 1e6
  tl.set_yticks(range(len(rows)), list(rows), fontsize=7)
  tl.invert_yaxis()
  tl.set_xlabel("simulated time (us)")
  tl.set_title("traced blocks (blue: TMA, orange: tensor core, gray: waits)")

  peak = gpu.num_sms * gpu.tensor_rate("f16") * gpu.clock_hz / 1e12  # (sustained)
  bw = gpu.hbm_bytes_per_s / 1e12
  xs = [2.0 ** e for e in range(-4, 13)]
  roof.loglog(xs, [min(peak, bw * x) for x in xs], "k-", label=f"{gpu.name}: f16 tensor cores, HBM")
  for k in report.kernels:
    if k.hbm_bytes and k.time_s:
      x = max(k.wgmma_flops / k.hbm_bytes, xs[0])
      roof.loglog([x], [max(k.tflops, 1e-3)], "o", label=f"{k.name} ({k.bound})")
  roof.set_xlabel("FLOP per HBM byte")
  roof.set_ylabel("TFLOP/s")
  roof.set_title("roofline")
  roof.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
