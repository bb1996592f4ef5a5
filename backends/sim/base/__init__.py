"""The vocabulary every stage shares, importing no stage: how JAX's internals
are read (jax_internals.py, the one module that imports jax._src), the
user's file:line of an equation or a traceback (locations.py), the events a
group of blocks hands the merge (events.py), and a TMA load as the L2 model
follows it (loads.py)."""
