"""The cost model: every cycle the simulator assigns (model), how many blocks an
SM holds and their registers (occupancy), what bounds a kernel in words
(bound), and the clock the board's power allows (power). Hardware figures are
data in pallas_sim/gpus.py, each with its source."""
