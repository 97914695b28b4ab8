"""rematopt: exact rematerialization planning.

Data flows one way: importers (:func:`load` for files) -> :class:`Graph`
-> planners -> :class:`Plan` -> :func:`simulate` (the judge) -> exporters.
"""

from .errors import BudgetError, GraphError, ImportFailure, PlanError, PlannerError, RematoptError
from .graph import Graph, Node
from .importers import load
from .plan import Plan, PlanBuilder
from .reference import no_remat_peak, no_remat_plan, peak_lower_bound, working_set_bound
from .simulate import Replay, simulate
from .solve import PlanMismatch, Solution, solve

__version__ = "0.1.0"

__all__ = [
    "BudgetError", "Graph", "GraphError", "ImportFailure", "Node", "Plan", "PlanBuilder", "PlanError",
    "PlanMismatch", "PlannerError", "RematoptError", "Replay", "Solution", "load", "no_remat_peak",
    "no_remat_plan", "peak_lower_bound", "simulate", "solve", "working_set_bound",
]
