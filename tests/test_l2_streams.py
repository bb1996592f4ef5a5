"""lab/calibrate.py's L2 streams with a group's readers out of step
(l2_lag*): each reader loads the tile its group's first reader loads
r * lag steps later, checked against the reference in the simulator."""

import numpy as np
import pytest

import pallas_sim as ps

from lab import calibrate as C


@pytest.mark.parametrize("lag", [0, 1, 3])
def test_readers_out_of_step_load_the_tiles_their_lag_names(lag):
  x = np.arange(5 * 8 * 128, dtype=np.float32).reshape(5 * 8, 128)
  kw = dict(n=6, blocks=4, tile_rows=8, region_tiles=5, readers=2, lag=lag)
  with ps.backend("sim"):
    out = np.asarray(C.tma_stream(x, slots=2, **kw))
  ref = np.asarray(C._stream_ref(x, **kw))
  np.testing.assert_array_equal(out, ref)
  # Block b's last tile: step (n - 1 + (b % 2) * lag) of group b // 2 (two
  # groups), mod the region's 5 tiles.
  tiles = [int(out[b, 0, 0]) // (8 * 128) for b in range(4)]
  assert tiles == [((5 + (b % 2) * lag) * 2 + b // 2) % 5 for b in range(4)]


def test_the_lag_micros_are_the_in_step_streams_but_for_the_lag():
  for mib in (8, 48):
    for slots in (2, 4, 8):
      same = C.by_name(f"l2_half_{mib}mib_{slots}slots").params
      for lag in (1, 16):
        m = C.by_name(f"l2_lag{lag}_{mib}mib_{slots}slots")
        assert {k: v for k, v in m.params.items() if k != "lag"} == same
        assert m.params["lag"] == lag
