"""The checkpoint-name planners: JAX's stock policies (``presets``), the
space of ``checkpoint_name`` policies and the plan each implies (``space``),
CP-SAT over that space (``search``) and the ``jax-names`` planner (``names``)."""
