"""The ``rematopt`` command. Each command group lives in its own module,
which knows nothing of this one; every command is registered below, in one
place. Bad input of any kind ends in one line on stderr and exit status 2
(see :func:`main`)."""

from __future__ import annotations

import sys
import warnings

import click

from ..errors import RematoptError
from . import batch, common, core, jax, mlir, peak, study, xla


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="rematopt")
def cli() -> None:
    """rematopt: exact rematerialization planning (keep / recompute / offload)."""


for command in (core.inspect, core.simulate_cmd, core.solve_cmd, core.generate, core.bench, core.import_group,
                core.export_group, batch.batch_cmd, batch.report_cmd, jax.jax_measure, jax.jax_policies,
                peak.pareto_cmd, peak.max_batch_cmd, study.study_group, xla.xla_group):
    cli.add_command(command)
for group, commands in ((core.import_group, (jax.import_jax, mlir.import_mlir_cmd)),
                        (core.export_group, (jax.export_jax_policy, mlir.export_mlir_cmd))):
    for command in commands:
        group.add_command(command)


def _warn_one_line(message, category, filename, lineno, file=None, line=None) -> None:
    """Planner warnings (e.g. ``REMAT_PLAN_CLONE_BOUND``) as one stderr line, not two."""
    click.echo(f"rematopt: warning: {message}", err=True)


def main() -> None:
    """Console entry point: typed errors become one line and exit status 2."""
    warnings.showwarning = _warn_one_line
    common.command_started()
    try:
        code = cli.main(standalone_mode=False)
    except RematoptError as e:
        click.echo(f"rematopt: {e}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("rematopt: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("rematopt: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except OSError as e:  # an output path that cannot be written, say
        click.echo(f"rematopt: {e.filename}: {e.strerror}" if e.filename else f"rematopt: {e}", err=True)
        sys.exit(2)
    finally:
        common.command_started(None)
    sys.exit(code if isinstance(code, int) else 0)
