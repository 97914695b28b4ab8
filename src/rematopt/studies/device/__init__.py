"""``rematopt bench device``: the remat JAX users write against rematopt's plans, as the device runs them.

For each model, every variant of its training step (``jax.jit(jax.value_and_grad(loss))``) is
compiled and run once on the backend present, on a GPU each in a fresh process (so one row's memory
does not leak into the next row's device peak), on CPU a model's rows in one (the peak there is the
compiled program's), two such processes at a time, the timing processes alone (:func:`.bench._model_tasks`):

- ``plain``: the step as written;
- ``layer:<policy>`` / ``step:<policy>``: the factory's ``remat=`` per layer, in the model library's
  idiom, and on the whole loss;
- ``xla-gpu@r`` (GPU only): the plain step under XLA's own GPU rematerialization, its slop factor
  aimed at r x the plain step's compiled peak;
- ``rematopt@r``: a plan for r x the plain step's peak applied with ``rematopt.jax.apply_plan``,
  from ``--verify xla``'s loop on CP-SAT's deterministic clock, so the plans are the same on any load.

Each row: XLA's compiled peak (``peak_memory_in_bytes`` on GPU / TPU; temp + arguments + outputs -
aliases on CPU, which computes no peak), the device's peak where it reports one, and the largest
gradient difference from the plain step. Then every variant of the model is timed in interleaved
rounds, each in a process of its own (and a second compile of the plain step, ``plain (again)``,
beside them: the noise floor); a row's step time is its fastest round. On CPU the clock is the
process's CPU time with the worker pinned to one core, so the other work on a shared machine does
not enter the figure; on a GPU, wall-clock time. Last, each row's kernels are priced
(:mod:`rematopt.xla.cost`) on the rates micro-benchmarks measured on the core
(:mod:`rematopt.xla.machine`; on a GPU its data sheet), scaled so that the plain step's predicted
time is its measured time, plus on CPU the page faults the compiled program predicts
(:func:`rematopt.xla.cost.step_faults`) at their measured price; every other row is predicted. On
CPU every row runs under XLA's memory-minimizing scheduler
(``--xla_cpu_enable_concurrency_optimized_scheduler=false``), without which XLA's CPU schedule
undoes rematerialization.
"""
