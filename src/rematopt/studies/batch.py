"""Batch solving: every (graph, budget ratio, planner) job, one durable row each.

Why it is built this way:

* Each job runs in a fresh interpreter (``python -m rematopt.studies.batch SPEC
  RESULT``) with a memory limit and a hard timeout (time limit + margin), so a
  crash, an out-of-memory abort or a hung solver becomes a row with its error
  and never stops the batch. A fresh process rather than a fork also works
  inside dask workers, which may not have children of their own.
* Each row is appended to ``results.jsonl`` and fsync'd the moment its job
  ends, so a crash or Ctrl-C loses only the jobs still running; a torn last
  line is ignored on read. ``results.csv`` (and ``results.parquet`` when
  pyarrow is installed) are derived from it.
* Every plan goes through :func:`rematopt.solve`, which replays it; rows hold
  the simulator's figures (``Solution.summary()``), not the planner's claims.
* Exact planners run after the fast planners of the same (graph, budget) and
  start from the best of their plans (option ``hint``); without one they fall
  back to their own warm start.
* ``--resume`` skips the jobs whose key (graph file hash, budget ratio,
  planner, options) already has a row with an answer (see ``FINISHED``) and
  runs the rest: new jobs, and those that failed (ERROR, CRASH, OOM, TIMEOUT;
  a planner stopped at the hard timeout with neither plan nor proof is a
  TIMEOUT, not its UNKNOWN) or were SKIPPED. A rerun's row is appended like
  any other, so a crash or Ctrl-C still loses nothing; readers take the last
  row of a key, in the place of the first, and the end of a run rewrites
  ``results.jsonl`` (to a temporary name, then renamed) with one row per job.

The dask executor assumes the graph files and the results directory are on a
file system every worker sees (as on a cluster with a shared home).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from .. import planners
from ..errors import BudgetError, GraphError, NotApplicable, RematoptError
from ..importers import load as load_graph
from ..planners.options import parse
from ..reference import no_remat_peak, peak_lower_bound, ratio_budget
from ..solve import REFUSE_IMPOSSIBLE_BUDGET

if TYPE_CHECKING:
    from ..solve import Solution

RESULTS = "results.jsonl"
EXACT = ("cpsat",)  # take a hint from the fast planners, so they run last
GRAPH_SUFFIXES = (".json", ".mlir")
# Statuses the batch adds to the planners' own (OPTIMAL, FEASIBLE, ...).
FAILURES = ("INFEASIBLE_BUDGET", "ERROR", "CRASH", "OOM", "TIMEOUT", "SKIPPED")
# Rows that answer their job, which --resume keeps: a replayed plan (OPTIMAL,
# FEASIBLE, OVER_BUDGET), a verdict that no plan exists (INFEASIBLE, or the
# batch's INFEASIBLE_BUDGET), or the planner's own report that its time limit
# gave neither (UNKNOWN: the same job would say it again; a longer --time-limit
# is another job). Every other status (ERROR, CRASH, OOM, TIMEOUT, SKIPPED) is
# a run that gave no answer, and a resume runs it again.
FINISHED = ("OPTIMAL", "FEASIBLE", "OVER_BUDGET", "INFEASIBLE", "INFEASIBLE_BUDGET", "UNKNOWN")
DEFAULT_MEMORY_LIMIT = 4 << 30
DEFAULT_TIMEOUT_MARGIN = 30.0  # interpreter start, graph load, replay, plan save
STOP_GRACE_S = 10.0  # after SIGINT at the hard timeout, for the planner to hand back its best plan
_ROLE_TOKENS = {"train", "training", "infer", "inference", "fwd", "bwd", "forward", "backward", "grad"}


# -- inputs ---------------------------------------------------------------------


@dataclass(frozen=True)
class GraphInput:
    """A graph file and what the batch needs to know about it up front."""

    path: Path
    sha256: str
    name: str
    family: str
    nodes: int
    edges: int
    no_remat_peak: int
    peak_lower_bound: int


def family_of(name: str) -> str:
    """Graph family = the name's leading tokens before a size or role token:
    ``random_layered_n100`` -> ``random_layered``, ``vgg16_train`` -> ``vgg16``,
    ``gpt2_small_b8`` -> ``gpt2_small``, ``chain`` -> ``chain``."""
    keep = []
    for tok in re.split(r"[_\-.]", name):
        if keep and (tok.lower() in _ROLE_TOKENS or re.fullmatch(r"[a-z]?\d+[a-z]?", tok.lower())):
            break
        keep.append(tok)
    return "_".join(keep) or name


def find_graph_files(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given, directories searched recursively for ``*.json`` and
    ``*.mlir``; GraphError for a path that does not exist."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in GRAPH_SUFFIXES))
        elif p.is_file():
            out.append(p)
        else:
            raise GraphError(f"{p}: no such file or directory")
    return out


def load_inputs(paths: Iterable[str | Path]) -> tuple[list[GraphInput], list[tuple[Path, str]]]:
    """Load and fingerprint every graph. Files named explicitly must be graphs
    (GraphError otherwise); files found in a directory that are not graphs are
    returned as ``(path, reason)`` skips. Identical files are kept once."""
    explicit = {Path(p) for p in paths if Path(p).is_file()}
    inputs: list[GraphInput] = []
    skipped: list[tuple[Path, str]] = []
    seen: set[str] = set()
    for path in find_graph_files(paths):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest in seen:
            continue
        try:
            g = load_graph(path)
        except RematoptError as e:
            if path in explicit:
                raise
            skipped.append((path, str(e)))
            continue
        seen.add(digest)
        family = str(g.meta.get("family") or family_of(g.name))
        inputs.append(GraphInput(path.resolve(), digest, g.name, family, g.n, len(g.edges),
                                 no_remat_peak(g), peak_lower_bound(g)))
    return inputs, skipped


# -- the results log ------------------------------------------------------------


def finished(row: dict[str, Any]) -> bool:
    """Whether a row answers its job (see ``FINISHED``), so a resume keeps it."""
    return row.get("status") in FINISHED


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``results.jsonl`` (or of the directory holding one), one per
    job: a later row of a key (a resumed job's rerun) takes the place of the
    earlier one, unless only the earlier one is finished. Lines that do not
    parse (a torn last line after a crash) are ignored."""
    return list(_read_log(path)[0].values())


def _read_log(path: str | Path) -> tuple[dict[str, dict[str, Any]], int]:
    """Rows by key (as ``read_rows``) and the number of non-blank lines read."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS
    rows: dict[str, dict[str, Any]] = {}
    lines = 0
    if not path.exists():
        return rows, lines
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            lines += 1
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if not (isinstance(row, dict) and "key" in row):
                continue
            old = rows.get(row["key"])
            if old is None or finished(row) or not finished(old):  # never trade an answer for a failure
                rows[row["key"]] = row  # a dict keeps the key's first place
    return rows, lines


class ResultsLog:
    """Append-only JSON-lines file: one row per line, flushed and fsync'd."""

    def __init__(self, path: Path):
        self.path = path
        # A crash mid-write leaves a line without its newline: end it, so the
        # next row starts on a line of its own and the torn one stays unreadable.
        if path.exists() and path.stat().st_size:
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
            if torn:
                with open(path, "ab") as f:
                    f.write(b"\n")
        self._lock = threading.Lock()

    def append(self, row: dict[str, Any]) -> None:
        line = (json.dumps(row, default=str) + "\n").encode()
        with self._lock, open(self.path, "ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def compact(self) -> None:
        """Rewrite the file as ``read_rows`` sees it: one row per job, a
        rerun's row in its job's first place, no torn lines. Written to a
        temporary name, fsync'd and renamed, so a crash or Ctrl-C leaves the
        old file (still read the same way) or the new one, never a mix."""
        with self._lock:
            rows, lines = _read_log(self.path)
            if lines == len(rows):
                return
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            try:
                with open(tmp, "wb") as f:
                    f.writelines((json.dumps(row, default=str) + "\n").encode() for row in rows.values())
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            finally:
                tmp.unlink(missing_ok=True)
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # the rename itself
            finally:
                os.close(dir_fd)


def write_tables(results_dir: str | Path) -> list[Path]:
    """Derive ``results.csv`` (and ``results.parquet`` when pyarrow is there)
    from ``results.jsonl``; each is written to a temporary name and renamed."""
    import pandas as pd

    results_dir = Path(results_dir)
    df = pd.DataFrame(read_rows(results_dir))
    written = []
    targets = [("results.csv", lambda p: df.to_csv(p, index=False))]
    try:
        import pyarrow  # noqa: F401

        # Parquet wants one type per column: text for the mixed ones, nulls kept.
        mixed = {c: df[c].map(lambda v: v if v is None or isinstance(v, str) else str(v))
                 for c in df.columns if df[c].dtype == object}
        targets.append(("results.parquet", lambda p: df.assign(**mixed).to_parquet(p, index=False)))
    except ImportError:
        pass
    for name, write in targets:
        tmp = results_dir / f".{name}.tmp"
        write(tmp)
        os.replace(tmp, results_dir / name)
        written.append(results_dir / name)
    return written


# -- jobs -----------------------------------------------------------------------


def job_key(graph_sha256: str, budget_ratio: float, planner: str, options: dict[str, Any]) -> str:
    blob = json.dumps([graph_sha256, budget_ratio, planner, options], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80]


def make_spec(g: GraphInput, ratio: float, planner: str, options: dict[str, Any], out: Path,
              memory_limit: int | None, timeout: float) -> dict[str, Any]:
    """Everything a worker needs to run one job, JSON-serialisable."""
    key = job_key(g.sha256, ratio, planner, options)
    stem = f"plans/{slug(g.name)}-{g.sha256[:8]}/{slug(planner)}-r{ratio:g}-{key[:8]}"
    opts = dict(options)
    log = stem.replace("plans/", "logs/", 1) + ".csv" if planner in EXACT else None
    if log:
        opts["log_path"] = str(out / log)
    return {
        "key": key, "graph": g.name, "family": g.family, "graph_file": str(g.path),
        "graph_sha256": g.sha256, "nodes": g.nodes, "edges": g.edges, "budget_ratio": ratio,
        "budget": ratio_budget(g.no_remat_peak, ratio),
        "planner": planner, "planner_ref": planners.REGISTRY[planner], "options": options,
        "run_options": opts, "out": str(out), "plan_path": stem + ".json", "log_path": log, "hint_path": None,
        "hint_from": None, "memory_limit": memory_limit, "timeout": timeout,
    }


def base_row(spec: dict[str, Any]) -> dict[str, Any]:
    """The fields every row has, whatever became of its job."""
    return {
        "key": spec["key"], "graph": spec["graph"], "family": spec["family"],
        "graph_file": spec["graph_file"], "graph_sha256": spec["graph_sha256"],
        "nodes": spec["nodes"], "edges": spec["edges"], "budget": spec["budget"],
        "budget_ratio": spec["budget_ratio"], "planner": spec["planner"],
        "options": json.dumps(spec["options"], sort_keys=True, default=str),
        "status": "ERROR", "peak_bytes": None, "compute_cost": None, "base_cost": None,
        "overhead": None, "transfer_bytes": None, "gap": None, "bound": None, "optimal_in": None, "wall_s": None,
        "time_to_first_s": None, "time_to_best_s": None, "job_s": None,
        "rematopt_version": _version("rematopt"), "ortools_version": _version("ortools"),
        "has_plan": False, "plan_path": None, "log_path": spec.get("log_path"),
        "hint_from": spec.get("hint_from"), "error": None,
    }


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


# Row columns read from the planner's Stats (column -> field); the figures of
# the plan itself come from its replay.
STAT_COLUMNS = {"bound": "best_bound", "gap": "gap", "optimal_in": "optimal_in",
                "time_to_first_s": "time_to_first_s", "time_to_best_s": "time_to_best_s"}


def solution_row(spec: dict[str, Any], sol: "Solution") -> dict[str, Any]:
    """A row from a solution: the simulator's figures (``Solution.summary()``),
    the planner's bound, gap and timings (its Stats); its other scalar stats
    go to ``stats``."""
    row = base_row(spec)
    summary = sol.summary()
    for k in ("status", "peak_bytes", "compute_cost", "base_cost", "overhead", "transfer_bytes",
              "recompute_cost", "compute_events", "events", "no_remat_peak_bytes",
              "working_set_bound_bytes", "wall_s", "has_plan"):
        row[k] = summary.get(k)
    row["budget"] = sol.budget
    for col, name in STAT_COLUMNS.items():
        row[col] = getattr(sol.plan.stats, name)
    used = set(row) | {"planner", "graph", "budget_bytes", *STAT_COLUMNS.values()}
    row["stats"] = json.dumps({k: v for k, v in summary.items()
                               if k not in used and isinstance(v, (int, float, str, bool))}, sort_keys=True)
    row["error"] = None
    return row


def run_job(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one job in this process (the worker side): a plan of a graph
    (:func:`planned_row`) or, for a ``--verify xla`` job, the closed loop on
    a JAX factory's step (:func:`~rematopt.studies.batch_verify.verified_row`).
    Failures become rows; nothing is raised."""
    from ..solve import PlanMismatch

    row = base_row(spec)
    out = Path(spec["out"])
    try:
        if "verify" in spec:
            from .batch_verify import verified_row

            row = verified_row(spec)
        else:
            row = planned_row(spec)
    except KeyboardInterrupt:  # the SIGINT of the hard timeout, before the planner could return
        row.update(status="TIMEOUT", error="stopped before the planner returned")
    except MemoryError:
        row.update(status="OOM", error=f"out of memory (limit {spec.get('memory_limit')} bytes)")
    except PlanMismatch as e:
        row.update(status="ERROR", error=f"plan failed its replay: {e}")
    except NotApplicable as e:
        row.update(status="SKIPPED", error=str(e))
    except Exception as e:  # noqa: BLE001  (any planner failure is a row, not a stopped batch)
        row.update(status="ERROR", error=f"{type(e).__name__}: {e}")
    if row.get("log_path") and not (out / row["log_path"]).exists():
        row["log_path"] = None
    return row


def planned_row(spec: dict[str, Any]) -> dict[str, Any]:
    """Load the graph, budget, plan, replay, save the plan: the job's row."""
    from ..plan import Plan
    from ..reference import resolve_budget
    from ..solve import solve

    row = base_row(spec)
    out = Path(spec["out"])
    planners.REGISTRY[spec["planner"]] = spec["planner_ref"]
    graph = load_graph(spec["graph_file"])
    budget = resolve_budget(graph, ratio=spec["budget_ratio"], check=False)
    row["budget"] = budget
    try:
        resolve_budget(graph, budget=budget, check=spec["planner"] in REFUSE_IMPOSSIBLE_BUDGET)
    except BudgetError as e:
        row.update(status="INFEASIBLE_BUDGET", error=str(e))
        return row
    options = dict(spec["run_options"], progress=False)
    if spec.get("hint_path"):
        options["hint"] = Plan.load(out / spec["hint_path"])
    if options.get("log_path"):
        Path(options["log_path"]).parent.mkdir(parents=True, exist_ok=True)
    limit_memory(spec.get("memory_limit"))
    sol = solve(graph, spec["planner"], budget=budget, **options)
    row = solution_row(spec, sol)
    if sol.has_plan:  # no plan file for a job without a plan
        path = out / spec["plan_path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        sol.plan.save(path)
        row["plan_path"] = spec["plan_path"]
    return row


def limit_memory(limit: int | None) -> None:
    """Cap this process's address space, so a runaway planner fails with
    MemoryError (or an abort) instead of taking the machine down."""
    if not limit:
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


# The worker processes running now, so an interrupted batch can end them.
_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()


def execute(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one job in a child interpreter under a hard timeout and return its
    row; a crash, a kill or a timeout becomes a failure row. Runs in a thread
    of the local pool or as a dask task."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rematopt-job-") as tmp:
        spec_file, result_file, err_file = (Path(tmp) / n for n in ("spec.json", "row.json", "stderr"))
        spec_file.write_text(json.dumps(spec))
        with open(err_file, "wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "rematopt.studies.batch", str(spec_file), str(result_file)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True)  # Ctrl-C reaches the batch, which ends it
            with _LIVE_LOCK:
                _LIVE.add(proc)
            stopped = False
            try:
                code = proc.wait(timeout=spec["timeout"])
            except subprocess.TimeoutExpired:
                stopped, code = True, _stop(proc)
            finally:
                with _LIVE_LOCK:
                    _LIVE.discard(proc)
        if code == 0 and result_file.exists():
            row = json.loads(result_file.read_text())
            if stopped:
                row["error"] = (f"stopped at the hard timeout ({spec['timeout']:g} s); "
                                + ("best plan kept" if row.get("plan_path") else "no plan"))
                if row["status"] == "UNKNOWN":  # no plan, no proof: not the planner's answer, a time-out
                    row["status"] = "TIMEOUT"
        else:
            row = base_row(spec)
            row["status"], row["error"] = failure_status(spec, code, err_file.read_text(errors="replace"), stopped)
    row["job_s"] = time.perf_counter() - start
    return row


def _stop(proc: subprocess.Popen) -> int | None:
    """SIGINT first (cpsat then stops its search and returns its best plan),
    SIGKILL after a grace period. Returns the exit status, None if killed."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def failure_status(spec: dict[str, Any], code: int | None, stderr: str, stopped: bool) -> tuple[str, str]:
    """``(status, error)`` of a worker that gave no row: TIMEOUT, OOM or CRASH, from how it ended."""
    tail = " | ".join(stderr.strip().splitlines()[-3:])
    if stopped:  # whatever the worker did with our SIGINT, it ran out of time
        return "TIMEOUT", f"stopped after {spec['timeout']:g} s (time limit + margin)"
    if code == -signal.SIGKILL:  # not ours, so most likely the kernel's OOM killer
        return "OOM", "worker killed by SIGKILL (out of memory?)"
    if "MemoryError" in stderr or "bad_alloc" in stderr or "out of memory" in stderr.lower():
        return "OOM", f"out of memory (limit {spec.get('memory_limit')} bytes): {tail}"
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    return "CRASH", f"worker {how}" + (f": {tail}" if tail else "")


def _kill_live() -> None:
    with _LIVE_LOCK:
        for proc in list(_LIVE):
            proc.kill()


# -- the batch --------------------------------------------------------------------


@dataclass
class BatchPlan:
    """The jobs of a batch, before any runs."""

    specs: list[dict[str, Any]]
    done: dict[str, dict[str, Any]]  # key -> finished row from an earlier run (--resume)
    skipped: list[dict[str, Any]] = field(default_factory=list)  # rows decided without a worker
    rerun: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> unfinished earlier row, run again


def check_jobs(planner_names: list[str], ratios: list[float], options: dict[str, Any]) -> None:
    """PlannerError for an unknown or unavailable planner or a bad option
    value, BudgetError for a ratio that is not a finite number > 0: before any job runs."""
    for name in planner_names:
        planners.get(name)  # unknown or not importable: fail before any job runs
        parse(planners.options_class(name), options, name)  # a bad value too
    for r in ratios:
        if not (r > 0 and math.isfinite(r)):
            raise BudgetError(f"budget ratio must be a finite number > 0, got {r}")


def previous_rows(out: Path, resume: bool) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """``(done, earlier)``: the finished and the unfinished rows of ``out``
    by key; RematoptError when ``out`` holds results and ``resume`` is off."""
    rows = read_rows(out)
    if rows and not resume:
        raise RematoptError(f"{out}: already holds {len(rows)} results; pass --resume to continue that "
                            "batch, or choose a new --out directory")
    # SKIPPED too runs again: a resume may lift the cap
    return ({row["key"]: row for row in rows if finished(row)},
            {row["key"]: row for row in rows if not finished(row)})


def plan_batch(inputs: list[GraphInput], planner_names: list[str], ratios: list[float], out: str | Path,
               options: dict[str, Any] | None = None, resume: bool = False,
               memory_limit: int | None = DEFAULT_MEMORY_LIMIT, timeout_margin: float = DEFAULT_TIMEOUT_MARGIN,
               exact_max_nodes: int | None = None, default_workers: int | None = None) -> BatchPlan:
    """The job list: fast planners first, exact ones last; with ``resume``,
    jobs with a finished row in ``out/results.jsonl`` are left out, and those
    whose row is a failure or SKIPPED run again. ``default_workers``
    sets the solver threads per job when ``options`` does not (it is not part
    of the job key, so a resume on another machine skips the same jobs).

    Raises PlannerError for an unknown or unavailable planner, and
    RematoptError when ``out`` holds results and ``resume`` is off.
    """
    out = Path(out).resolve()
    options = {k: v for k, v in (options or {}).items() if v is not None}
    check_jobs(planner_names, ratios, options)
    done, earlier = previous_rows(out, resume)
    timeout = float(options.get("time_limit") or 3600.0) + timeout_margin
    specs, skipped, rerun = [], [], {}
    order = sorted(planner_names, key=lambda p: p in EXACT)
    for planner in order:
        for g in inputs:
            for r in ratios:
                spec = make_spec(g, r, planner, options, out, memory_limit, timeout)
                if default_workers and "workers" not in options:  # cpsat's deterministic time runs one
                    spec["run_options"].setdefault("workers", 1 if "deterministic_time" in options
                                                   else default_workers)
                if spec["key"] in done:
                    continue
                if spec["key"] in earlier:
                    rerun[spec["key"]] = earlier[spec["key"]]
                row = base_row(spec)
                row["log_path"] = None
                if spec["budget"] < g.peak_lower_bound and planner in REFUSE_IMPOSSIBLE_BUDGET:
                    row.update(status="INFEASIBLE_BUDGET",
                               error=f"{g.path}: budget {spec['budget']:,} bytes is below the lower bound "
                                     f"{g.peak_lower_bound:,} bytes (working set or resident inputs)")
                    skipped.append(row)
                elif planner in EXACT and exact_max_nodes is not None and g.nodes > exact_max_nodes:
                    row.update(status="SKIPPED", error=f"{g.nodes} nodes > --exact-max-nodes {exact_max_nodes}")
                    skipped.append(row)
                else:
                    specs.append(spec)
    return BatchPlan(specs, done, skipped, rerun)


def best_hint(rows: Iterable[dict[str, Any]], spec: dict[str, Any]) -> dict[str, Any] | None:
    """The best fast plan of the spec's (graph, budget), ranked as cpsat's own
    warm start ranks them (:func:`~rematopt.planners.cpsat.warm_start.best_within`),
    among those the spec's settings admit: without offload, none with host
    transfers (keras_gemma_l2_w32 at 0.5 got jax-offload-dots' plan, which
    cpsat could not use, and answered UNKNOWN where jax-nothing-saveable's fit)."""
    from ..planners.cpsat.warm_start import Figures, best_within

    offload = bool(spec["options"].get("offload"))
    fits = [(row, Figures(row["compute_cost"], row["transfer_bytes"] or 0, row["peak_bytes"])) for row in rows
            if row["graph_sha256"] == spec["graph_sha256"] and row["budget_ratio"] == spec["budget_ratio"]
            and row["planner"] not in EXACT and row["status"] in ("OPTIMAL", "FEASIBLE")
            and row.get("plan_path") and row["budget"] is not None and row["peak_bytes"] <= row["budget"]
            and (offload or not row["transfer_bytes"])]
    best = best_within(fits, None, by_peak=spec["options"].get("objective") == "peak")
    return None if best is None else best[0]


def run_batch(batch: BatchPlan, out: str | Path, jobs: int = 1, executor: str = "local",
              scheduler: str | None = None,
              on_row: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run the planned jobs, ``jobs`` at a time, on the local process pool or a
    dask cluster (``executor="dask"``, ``scheduler`` = its address), append
    each row the moment its job ends, and derive the tables at the end.
    Returns the rows written by this run. Ctrl-C ends the running workers; the
    rows already written stay (started with SIGINT ignored, as a background
    job is, the batch takes no Ctrl-C; its workers' hard timeouts still work).
    At the end (Ctrl-C too) the log is compacted, so a rerun job's new row
    replaces its old one."""
    out = Path(out).resolve()
    (out / "plans").mkdir(parents=True, exist_ok=True)
    log = ResultsLog(out / RESULTS)
    new: list[dict[str, Any]] = []

    def record(row):
        log.append(row)
        new.append(row)
        if on_row:
            on_row(row)

    for row in batch.skipped:
        record(row)
    submit, close = _executor(executor, scheduler, jobs)
    pending = list(batch.specs)
    running: dict[Future, dict[str, Any]] = {}
    try:
        while pending or running:
            while pending and len(running) < jobs:
                spec = _next_runnable(pending, running.values())
                if spec is None:
                    break
                pending.remove(spec)
                if spec["planner"] in EXACT and "verify" not in spec:  # a closed loop plans at budgets of its own
                    hint = best_hint([*batch.done.values(), *new], spec)
                    if hint:
                        spec.update(hint_path=hint["plan_path"], hint_from=hint["planner"])
                running[submit(spec)] = spec
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in finished:
                spec = running.pop(fut)
                try:
                    row = fut.result()
                except Exception as e:  # noqa: BLE001  (an executor failure, e.g. a lost dask worker)
                    row = base_row(spec)
                    row.update(status="CRASH", error=f"executor: {type(e).__name__}: {e}")
                record(row)
    except BaseException:
        _kill_live()
        raise
    finally:
        close()
        log.compact()
        write_tables(out)
    return new


def _next_runnable(pending: list[dict[str, Any]], running: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The first pending job that can start: an exact job waits until no fast
    job of its (graph, budget) is pending or running, so it gets their best plan."""
    busy = {(s["graph_sha256"], s["budget_ratio"]) for s in [*pending, *running] if s["planner"] not in EXACT}
    for spec in pending:
        if spec["planner"] not in EXACT or (spec["graph_sha256"], spec["budget_ratio"]) not in busy:
            return spec
    return None


def _executor(kind: str, scheduler: str | None, jobs: int):
    """``(submit(spec) -> Future, close())``. Local: threads that each wait on
    one worker process. Dask: the same threads hand ``execute`` to the cluster."""
    pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="rematopt-batch")
    if kind == "local":
        return (lambda spec: pool.submit(execute, spec)), (lambda: pool.shutdown(wait=False, cancel_futures=True))
    if kind != "dask":
        raise RematoptError(f"unknown executor {kind!r}; use local or dask")
    if not scheduler:
        raise RematoptError("--executor dask needs --scheduler ADDRESS (e.g. tcp://host:8786)")
    try:
        from distributed import Client
    except ImportError:
        raise RematoptError("--executor dask needs dask.distributed (pip install 'rematopt[dask]')") from None
    try:
        client = Client(scheduler, timeout=10)
    except OSError as e:
        raise RematoptError(f"cannot reach the dask scheduler at {scheduler}: {e}") from None

    def submit(spec):
        return pool.submit(lambda: client.submit(execute, spec, key=f"rematopt-{spec['key']}", pure=False).result())

    def close():
        pool.shutdown(wait=False, cancel_futures=True)
        client.close()

    return submit, close


def _child_main(argv: list[str]) -> None:
    """Worker entry point: ``python -m rematopt.studies.batch SPEC_JSON ROW_JSON``.

    SIGINT raises KeyboardInterrupt here whatever the batch's own disposition:
    a batch started with SIGINT ignored (a background job) cannot be
    interrupted itself, but its workers inherit that, and the SIGINT of the
    hard timeout must still reach them (:func:`_stop`; in their own session,
    nothing else sends them one)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    spec_file, row_file = map(Path, argv)
    row = run_job(json.loads(spec_file.read_text()))
    tmp = row_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(row, default=str))
    os.replace(tmp, row_file)


if __name__ == "__main__":
    _child_main(sys.argv[1:])
