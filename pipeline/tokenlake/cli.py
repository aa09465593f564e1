"""The `tokenlake` command line: a thin layer over `tokenlake.Lake`.

Each command parses options, calls one method of the lake, and prints. Errors raised as
`PipelineError` become one line, `Error: ...`, and exit code 1; `--debug` (or TOKENLAKE_DEBUG=1)
shows the traceback instead.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tokenlake import __version__
from tokenlake.cli_util import (
    DUMP,
    LAKE,
    FreeTextArgs,
    bounded,
    parse_settings,
    read_sql,
    say,
)
from tokenlake.errors import (
    REFUSALS,
    PipelineError,
    UnreadableError,
    UsageError,
    ctrl_c_from_duckdb,
)
from tokenlake.orchestrate import MAX_SECONDS, MAX_WORKERS
from tokenlake.steps import parse_steps
from tokenlake.terminal import plural, safe_text

if TYPE_CHECKING:
    from tokenlake.lake import Lake
    from tokenlake.layout import Location
    from tokenlake.orchestrate.extract import ExtractOptions, ExtractSummary


def _lake(location: Location) -> Lake:
    """The lake every command is a method of (imported when a command runs: `--help` stays
    light)."""
    from tokenlake.lake import Lake

    return Lake(location)


class _Command(click.Group):
    """Turns library errors into one readable line; its commands take arguments that begin
    with `-` when they cannot be options (SQL starting with a `--` comment)."""

    command_class = FreeTextArgs

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with ctrl_c_from_duckdb():  # click then says "Aborted!", as for any Ctrl-C
                return super().invoke(ctx)
        except PipelineError as exc:
            if _debug(ctx):
                raise
            _fail(exc)
        except OSError as exc:  # the OS refused a file no reader named: still one line
            if exc.errno not in REFUSALS or exc.filename is None or _debug(ctx):
                raise
            _fail(UnreadableError(exc.filename, exc, "used"))


def _debug(ctx: click.Context) -> bool:
    return bool(ctx.params.get("debug") or os.environ.get("TOKENLAKE_DEBUG"))


def _fail(exc: PipelineError) -> None:
    say(f"Error: {exc}", err=True)
    sys.exit(1)


@click.group(cls=_Command)
@click.version_option(__version__, prog_name="tokenlake")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
def main(debug: bool) -> None:
    """tokenlake: query miles --dump-details training dumps with SQL.

    Example:

    \b
        tokenlake extract /data/runs/qwen-grpo --lake lake
        tokenlake query lake "SELECT * FROM step_stats"
    """
    handler = logging.StreamHandler()
    handler.setFormatter(_SafeFormatter("%(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    # tokenlake runs no BLAS routine (no float matrix product), so the threads numpy's
    # OpenBLAS starts when it is loaded are ~30 ms of CPU for nothing; read by OpenBLAS then,
    # and by the workers this process starts. A user's own setting is kept.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


class _PresetOption(click.Option):
    """`--preset`, whose help lists the presets: read from the generator only when help is
    shown, so that no other command pays for importing it."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from tokenlake.generator.synth_spec import PRESETS

        record = super().get_help_record(ctx)
        if record is None:
            return None
        names, text = record
        return names, text.replace("{presets}", ", ".join(sorted(PRESETS)))


class _SafeFormatter(logging.Formatter):
    """A logged warning reads like the CLI's own lines (`Warning: ...`, one line each), and
    quotes dump values too: escaped and cut like every other message."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{record.levelname.capitalize()}: {super().format(record)}"
        return safe_text(text, one_line=True)


@main.command()
@click.argument("dump_dir", type=DUMP)
@click.option(
    "--lake",
    type=LAKE,
    default=Path("lake"),
    show_default=True,
    help="Lake root directory, or an object-store URL (s3://bucket/lake); one lake holds"
    " many runs.",
)
@click.option("--run-name", help="The run's name in the lake. Default: the dump directory's name.")
@click.option("--steps", help="Only these steps, e.g. `0-9,12` (train and eval files of each).")
@click.option("--strict", is_flag=True, help="Stop at the first bad step instead of skipping it.")
@click.option(
    "--workers",
    type=int,
    default=None,
    show_default="the core count; 1 for a dump of at most 16 steps and 4 MiB",
    callback=bounded(1, MAX_WORKERS),
    help=f"Steps extracted in parallel processes (1 to {MAX_WORKERS}).",
)
@click.option("--silent", is_flag=True, help="No progress display on stderr.")
@click.option(
    "--replace",
    is_flag=True,
    help="Replace a run of the same name that was extracted from another directory.",
)
@click.option(
    "--follow",
    is_flag=True,
    help="Keep watching a live run; extract each step once complete (Ctrl-C ends).",
)
@click.option(
    "--with-experts",
    is_flag=True,
    help="Also keep the routing-replay arrays (rollout_routed_experts, rollout_indexer_topk)"
    " in the `experts` table; very large, so never by default.",
)
@click.option(
    "--poll",
    type=float,
    default=5.0,
    show_default=True,
    callback=bounded(0, MAX_SECONDS, low_open=True),
    help="With --follow: seconds between looks at the dump directory.",
)
@click.option(
    "--settle",
    type=float,
    default=30.0,
    show_default=True,
    callback=bounded(0, MAX_SECONDS),
    help="Seconds without change after which an incomplete step (rank files missing, a short"
    " NeMo-RL batch) lands marked incomplete instead of waiting; with --follow also after which"
    " a step counts as complete when its train files do not cover the newest extracted step's"
    " ranks (the first step, eval files, a step written on another rank layout).",
)
@click.option(
    "--tag",
    "tag_args",
    multiple=True,
    metavar="KEY=VALUE",
    help="Tag the run (repeatable); kept across re-extractions until changed.",
)
@click.option(
    "--meta",
    "meta_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Tag the run with a JSON or YAML object of string keys (--tag wins).",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Where steps run: local processes (--workers), or one Ray task per step"
    " (needs tokenlake[ray] and a lake path every node sees).",
)
@click.option(
    "--format",
    "dump_format",
    metavar="FORMAT",
    help="The dump's format: miles, slime-v1, slime-v2, nemo-rl or prime-rl (docs/frameworks.md)."
    " Default: detected from the directory's layout.",
)
@click.option(
    "--ray-address",
    metavar="ADDR",
    help="With --executor ray: the cluster, e.g. `auto`. Default: Ray's own (RAY_ADDRESS, a"
    " cluster started on this machine, else a new local Ray).",
)
def extract(
    dump_dir: Path | str,
    lake: Location,
    run_name: str | None,
    steps: str | None,
    strict: bool,
    workers: int | None,
    silent: bool,
    replace: bool,
    follow: bool,
    with_experts: bool,
    poll: float,
    settle: float,
    tag_args: tuple[str, ...],
    meta_file: Path | None,
    executor: str,
    ray_address: str | None,
    dump_format: str | None,
) -> None:
    """Extract a dump directory into the lake and rebuild the DuckDB catalog.

    Writes LAKE/tokens, LAKE/samples, LAKE/runs (Hive-partitioned Parquet) and
    LAKE/tokenlake.duckdb. Extracting a run again replaces that run's data only.

    Example:

    \b
        tokenlake extract /data/runs/qwen-grpo --lake lake --run-name qwen --steps 0-9
        tokenlake extract /data/runs/live --lake lake --follow
        tokenlake extract s3://bucket/runs/qwen --lake lake
        tokenlake extract /data/runs/fp8 --lake lake --tag precision=fp8 --meta run.yaml
        tokenlake extract /data/nemo-rl/logs/exp_001 --lake lake --format nemo-rl
    """
    from tokenlake.lake import rollup_connection_started

    # First: DuckDB's import and the binding of the rollups' views, in a thread, while the
    # rest of extraction's code is imported (`Lake.extract` takes it)
    with rollup_connection_started():
        from tokenlake.orchestrate.extract import ExtractInterrupted, ExtractOptions
        from tokenlake.orchestrate.progress import cli_reporter
        from tokenlake.orchestrate.scheduler import sigterm_as_ctrl_c
        from tokenlake.read.formats import parse_format
        from tokenlake.tags import user_tags

    dump_format = parse_format(dump_format)

    tags = user_tags(tag_args, meta_file) if tag_args or meta_file is not None else None
    options = ExtractOptions(
        run_name=run_name,
        steps=parse_steps(steps),
        strict=strict,
        workers=workers,
        replace=replace,
        tags=tags,
        executor=executor,
        ray_address=ray_address,
        follow=follow,
        poll_seconds=poll,
        settle_seconds=settle,
        dump_format=dump_format,
        with_experts=with_experts,
    ).check()
    if follow:
        with sigterm_as_ctrl_c():
            _follow(_lake(lake), dump_dir, options, silent)
        return
    reporter = None if silent else cli_reporter(sys.stderr)
    try:
        with sigterm_as_ctrl_c():
            summary = _lake(lake).extract(dump_dir, options, progress=reporter)
    except ExtractInterrupted as exc:
        say(_summary_line(exc.summary), one_line=True)
        say("Interrupted; the lake holds every step committed so far.", err=True)
        sys.exit(130)
    finally:
        if reporter is not None:
            reporter.close()
    _say_format(summary, dump_format)
    for label, message in summary.failed:
        say(f"Skipped step {label}: {message}", err=True, one_line=True)
    for path, why in summary.ignored_files:
        say(f"Ignored `{path}`: {why}", err=True, one_line=True)
    _say_warnings(summary)
    say(_summary_line(summary), one_line=True)
    if summary.failed:
        sys.exit(1)


def _follow(lake: Lake, dump_dir: Path | str, options: ExtractOptions, silent: bool) -> None:
    from tokenlake.orchestrate.step import StepStatus

    def on_round(summary: ExtractSummary) -> None:
        for label, message in summary.failed:
            say(f"Not yet: step {label}: {message}", err=True, one_line=True)
        _say_warnings(summary)
        if summary.steps or summary.counts[StepStatus.REMOVED]:
            say(_summary_line(summary), one_line=True)

    if not silent:
        say(f"Following {dump_dir} every {options.poll_seconds:g} s; Ctrl-C stops.", err=True)
    try:
        lake.follow(dump_dir, options, on_round=on_round)
    except KeyboardInterrupt:  # before its first round started: nothing was written yet
        pass
    say("Stopped; the lake holds every step extracted so far.", err=True)


def _say_format(summary: ExtractSummary, forced: str | None) -> None:
    """Which format the dump was read in: said for every format but miles' own (the one
    tokenlake read before it read others), and whenever --format chose it."""
    from tokenlake.read.formats import FORMATS

    if summary.dump_format == "miles" and forced is None:
        return
    how = "as --format says" if forced is not None else "detected from its layout"
    say(f"Read the dump as {FORMATS[summary.dump_format].title} ({how}).", err=True)


def _say_warnings(summary: ExtractSummary) -> None:
    for warning in summary.warnings:
        say(f"Warning: {warning}", err=True, one_line=True)


def _summary_line(summary: ExtractSummary) -> str:
    counts = ", ".join(f"{n} {status}" for status, n in summary.counts.items())
    text = (
        f"Run `{summary.run}`: {counts} steps; wrote {summary.samples:,} samples and"
        f" {summary.tokens:,} tokens in {summary.seconds:.1f} s -> {summary.lake}"
    )
    if summary.nonfinite_values:
        text += f" ({summary.nonfinite_values:,} NaN/inf values kept)"
    return text


@main.command()
@click.argument("lake", type=LAKE, default=Path("lake"))
@click.option("--run", "run_name", help="Check only this run.")
@click.option(
    "--deep",
    is_flag=True,
    help="Also compute each step's rollups from its tokens and compare them with the stored ones.",
)
def verify(lake: Location, run_name: str | None, deep: bool) -> None:
    """Reconcile the lake with its manifests and the dumps it came from; exit 1 on a mismatch.

    Checks every extracted step: files present, every sample once, token rows = sum of
    response lengths, checksum of token ids and masks, source files unchanged; with --deep,
    its rollups against its tokens.

    Example:

    \b
        tokenlake verify lake --run qwen
    """
    checked, problems = _lake(lake).verify(run_name, deep)
    for problem in problems:  # names from a manifest: never raw to the terminal
        say(str(problem), one_line=True)
    click.echo(f"{plural(checked, 'step')} checked, {plural(len(problems), 'problem')}")
    if problems:
        sys.exit(1)


@main.command()
@click.argument("lake", type=LAKE, default=Path("lake"))
@click.option(
    "--recompute",
    is_flag=True,
    help="Compute every step's rollups again from its tokens, current or not.",
)
def views(lake: Location, recompute: bool) -> None:
    """Rebuild LAKE/tokenlake.duckdb from the lake's Parquet files and the sql/ views.

    Steps without rollups of this tokenlake version (written by an older one) get them first,
    computed from their token files; the dumps are not read.

    Example:

    \b
        tokenlake views lake
    """
    result = _lake(lake).build_views(recompute)
    if result.rollups_computed:
        say(f"Computed the rollups of {plural(result.rollups_computed, 'step')} from their tokens.")
    say(f"Rebuilt {result.catalog}", one_line=True)
    for warning in result.warnings:
        say(f"Warning: {warning}", err=True, one_line=True)


@main.command()
@click.argument("lake", type=LAKE)
@click.argument("run_name")
def drop(lake: Location, run_name: str) -> None:
    """Remove one run from the lake: its files, manifest and rows in every view.

    Example:

    \b
        tokenlake drop lake qwen-grpo-old
    """
    _lake(lake).drop(run_name)
    say(f"Dropped run `{run_name}` from {lake}", one_line=True)


@main.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.option(
    "--preset",
    cls=_PresetOption,
    default="example",
    show_default=True,
    help="Layout and size preset, one of: {presets} (docs/generator.md says what each is).",
)
@click.option("--seed", type=int, default=None, help="Override the preset's random seed.")
@click.option("--force", is_flag=True, help="Overwrite dump files of an earlier generation in OUT.")
@click.option(
    "--miles-dashboard",
    is_flag=True,
    help="Also write dashboard/meta.json and metrics.jsonl, as miles' --use-miles-dashboard.",
)
def generate(out: Path, preset: str, seed: int | None, force: bool, miles_dashboard: bool) -> None:
    """Write a synthetic miles dump (deterministic) for trying tokenlake or testing it.

    Example:

    \b
        tokenlake generate /tmp/dump --preset cp-thd
        tokenlake generate /tmp/dump --miles-dashboard
    """
    import dataclasses

    from tokenlake.generator import synth

    if preset not in synth.PRESETS:
        raise UsageError(f"Unknown preset `{preset}`; choose one of: {', '.join(synth.PRESETS)}.")
    spec = synth.PRESETS[preset]
    if seed is not None:
        spec = dataclasses.replace(spec, seed=seed)
    if miles_dashboard:
        spec = dataclasses.replace(spec, miles_dashboard=True)
    synth.write_dump(out, spec, force=force)
    click.echo(f"Wrote preset `{preset}` dump to {out}")


@main.command()
@click.argument("lake", type=LAKE)
@click.argument("run_name")
@click.argument("tag_args", nargs=-1, metavar="[KEY=VALUE]...")
@click.option("--remove", multiple=True, metavar="KEY", help="Remove this tag (repeatable).")
def tag(lake: Location, run_name: str, tag_args: tuple[str, ...], remove: tuple[str, ...]) -> None:
    """Set or remove a run's tags without re-reading its dump; prints the tags after.

    Rewrites the run's `runs` row (`tags_json`), its manifest and the catalog (`run_tags`).

    Example:

    \b
        tokenlake tag lake qwen-fp8 precision=fp8 team=rl
        tokenlake tag lake qwen-fp8 --remove team
    """
    from tokenlake.tags import parse_tags

    if not tag_args and not remove:
        raise UsageError("Give tags to set (`key=value`) or --remove KEY.")
    result = _lake(lake).tag(run_name, parse_tags(tag_args), remove)
    for warning in result.warnings:
        say(f"Warning: {warning}", err=True, one_line=True)
    shown = ", ".join(f"{k}={v}" for k, v in sorted(result.tags.items())) or "none"
    say(f"Run `{run_name}` tags: {shown}", one_line=True)


_settings_option = click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="NAME=VALUE",
    help="Override a drift_settings threshold for this command (repeatable).",
)


@main.command()
@click.argument("lake", type=LAKE)
@click.argument("sql", required=False)
@click.option(
    "--file",
    "sql_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Read the SQL from this file (SQL `-` reads it from stdin).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json", "parquet"]),
    default="table",
    show_default=True,
    help="Output format.",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path),
    help="Write to this file instead of stdout (required for parquet on a terminal).",
)
@_settings_option
def query(
    lake: Location,
    sql: str | None,
    sql_file: Path | None,
    fmt: str,
    output: Path | None,
    settings: tuple[str, ...],
) -> None:
    """Run SQL against the lake's catalog and print the result.

    Every view of the catalog is available: tokens, samples, runs, sample_stats, group_stats,
    step_stats, drift_* (see docs/views.md and docs/drift.md).

    Example:

    \b
        tokenlake query lake "SELECT * FROM step_stats"
        tokenlake query lake "SELECT * FROM drift_steps" --format csv -o drift.csv
        tokenlake query lake --file report.sql
        echo "SELECT count(*) FROM tokens" | tokenlake query lake -
    """
    text = read_sql(sql, sql_file)
    rendered = _lake(lake).query_text(text, fmt, parse_settings(settings))
    if output is not None:
        mode = "wb" if isinstance(rendered, bytes) else "w"
        with open(output, mode) as handle:
            handle.write(rendered)
    elif isinstance(rendered, bytes):
        if sys.stdout.isatty():
            raise UsageError("Parquet output is binary; give --output FILE or redirect stdout.")
        sys.stdout.buffer.write(rendered)
    else:
        click.echo(rendered, nl=not rendered.endswith("\n"))


@main.command()
@click.argument("lake", type=LAKE, default=Path("lake"))
@_settings_option
def audit(lake: Location, settings: tuple[str, ...]) -> None:
    """Run the health checks in sql/audits/; print them and exit 1 if an error audit fails.

    Each audit is a query returning the offending rows (zero rows = healthy) with a severity:
    error (exit 1), warning or info (printed, exit 0). Thresholds come from the drift_settings
    view; override them with --set.

    Example:

    \b
        tokenlake audit lake --set alarm_mean_abs_lp_diff_smtm=0.2
    """
    from tokenlake.serve.audit import format_audit_report, has_errors

    results = _lake(lake).audit(parse_settings(settings))
    click.echo(format_audit_report(results))
    if has_errors(results):
        sys.exit(1)


@main.command()
@click.argument("lake", type=LAKE, default=Path("lake"))
@click.option(
    "--run",
    "runs",
    multiple=True,
    metavar="NAME",
    help="Report this run (repeatable; runs overlay in every chart). Default: every run.",
)
@click.option("--steps", help="Only these training steps, e.g. `0-9,12`. Default: all.")
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path),
    default=Path("report.html"),
    show_default=True,
    help="The HTML file to write (self-contained: open it anywhere, offline).",
)
@click.option(
    "--worst",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Worst samples (by mean |lp_diff|) per run shown with a per-token strip.",
)
def report(
    lake: Location, runs: tuple[str, ...], steps: str | None, output: Path, worst: int
) -> None:
    """Write one self-contained HTML report of the lake's health and drift, with charts.

    Sections: runs, audits, reward health per step, drift per step, where the drift is,
    worst tokens and samples. Every script and style is inline; no network is needed.

    Example:

    \b
        tokenlake report lake -o report.html
        tokenlake report lake --run qwen-fp16 --run qwen-bf16 --steps 0-99
    """
    summary = _lake(lake).report(output, runs, parse_steps(steps), worst)
    click.echo(
        f"Wrote {summary.path} ({summary.size / 1e6:.1f} MB, {plural(len(summary.runs), 'run')})"
        f" in {summary.seconds:.1f} s"
    )


@main.command()
@click.argument("lake", type=LAKE, default=Path("lake"))
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=8765,
    show_default=True,
    help="The TCP port to listen on (0: a free one).",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="The address to listen on; any but a loopback one requires the token printed in the URL.",
)
def serve(lake: Location, port: int, host: str) -> None:
    """Serve the explorer: pages over the lake's runs, steps, samples and tokens, and a
    read-only SQL console. Prints the URL to open; Ctrl-C stops it.

    Example:

    \b
        tokenlake serve lake
        tokenlake serve lake --host 0.0.0.0 --port 8800   # prints a URL with ?token=...
    """

    def announce(url: str) -> None:
        say(f"Serving `{_lake(lake).root}` at {url} (Ctrl-C stops)", one_line=True)

    _lake(lake).serve(host=host, port=port, announce=announce)
