"""The jaxpr -> Program compiler and its run loop (compiler), ref views and
transforms (refview), and one rule module per primitive family (rules/)."""
