"""Front ends: every way a graph gets into rematopt.

:func:`load` is the one entry point for files; it picks the front end by
content (JSON with ``"format": "rematopt.graph/1"`` or node-link JSON) or by
extension (``.mlir``). :class:`~rematopt.graph.Graph` knows only its own
format (``from_dict``), so the graph module imports no front end.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import GraphError
from ..graph import Graph
from ..jsonfile import read_json


def load(path: str | Path, function: str | None = None, drop_unsafe_marks: bool = False) -> Graph:
    """Load a graph file of any supported kind (``function``: the MLIR
    function to import; ``drop_unsafe_marks``: see
    :func:`rematopt.importers.mlir.import_mlir`).

    Raises GraphError (or ImportFailure from a front end) with the file named.
    """
    path = Path(path)
    if not path.exists():
        raise GraphError(f"{path}: no such file")
    if path.is_dir():
        raise GraphError(f"{path}: is a directory, not a graph file")
    if path.suffix == ".mlir":
        from .mlir import import_mlir

        return import_mlir(path, function=function, drop_unsafe_marks=drop_unsafe_marks)
    doc = read_json(path, GraphError)
    from .nodelink import from_nodelink, is_nodelink

    if is_nodelink(doc):
        return from_nodelink(doc, source=str(path))
    return Graph.from_dict(doc, source=str(path))
