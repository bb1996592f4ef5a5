"""The simulator backend: capture -> interpret (rules call into machine) -> report."""
