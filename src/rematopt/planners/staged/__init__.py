"""The staged plan space that ``cpsat`` searches and ``rotor`` solves its
stages in: first computations in one order, each stage recomputing or
prefetching at most once per value (``docs/cpsat.md``, "The plan space").

| module | what |
| --- | --- |
| :mod:`.order` | the order of first computations, and which plans lie in its space |
| :mod:`.model` | the formulation of the space, written once for CP-SAT and its LP |
| :mod:`.backends` | the two solvers the formulation is built on, and CP-SAT's parameters |
| :mod:`.solution` | between plans and the model's assignments, both ways |
| :mod:`.bounds` | lower bounds that hold for every plan of the space |
"""
