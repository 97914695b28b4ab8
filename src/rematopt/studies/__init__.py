"""Studies over many solves: the batch and its report, the Pareto curve,
max-batch, the benchmarks and the name-policy comparison. They sit on top of
``solve`` and the planners; nothing below imports them."""
