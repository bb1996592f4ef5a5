"""The simulated machine: memory, scheduler, cost model. No JAX imports here."""
