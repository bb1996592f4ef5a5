"""Backends of pallas-sim: `sim` (the simulator) and `mosaic` (the real lowering)."""
