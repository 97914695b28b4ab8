"""Typed errors. Library code raises these; the CLI prints ``str(error)`` as one
line and exits with status 2. Messages name the file (when there is one) first."""


class RematoptError(Exception):
    """Bad input of any kind: the user's to fix, never a bug of ours."""


class GraphError(RematoptError):
    """A graph file or graph object breaks the ``rematopt.graph/1`` contract."""


class PlanError(RematoptError):
    """A plan file breaks the ``rematopt.plan/1`` contract."""


class BudgetError(RematoptError):
    """A budget no plan can meet (below the peak lower bound) or a malformed one."""


class PlannerError(RematoptError):
    """Unknown planner, bad planner option, or a planner that cannot run here."""


class NotApplicable(PlannerError):
    """A planner that needs what this graph lacks (jax-names: checkpoint
    names): a batch skips the job instead of counting an error."""


class ImportFailure(RematoptError):
    """A front end (node-link, JAX, MLIR) could not turn its input into a graph."""


def located(source: str | None, problem: str) -> str:
    """``"file: problem"`` when the source is known, else just the problem."""
    return f"{source}: {problem}" if source else problem
