"""What XLA compiled: the compiled step's memory and kernels read from its
optimized HLO, what XLA is told (:mod:`.flags`), and the closed loop that
checks a plan on the compiled step (:mod:`.verify`)."""
