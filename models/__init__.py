"""Model definitions in plain JAX, each with a ``factory(**config) -> (loss_fn, example_args)``
usable as ``rematopt import jax models.NAME:factory`` from the repository root."""
