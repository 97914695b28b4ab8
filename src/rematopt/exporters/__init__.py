"""Back ends: plans written into the programs they were made for (MLIR, JAX policies)."""
