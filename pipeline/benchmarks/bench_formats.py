"""`make bench-formats`: tokenlake's object-store commit protocol against table formats.

The same step tables (a synthetic dump of the `bench` preset, built by `build_step_tables`)
go to a moto S3 server on 127.0.0.1 that this tool starts itself, once per writer and
repetition, each into a fresh bucket (pipeline/benchmarks/bench_formats_writers.py):

- tokenlake: the real code (objects under fresh names, then the manifest PUT that commits);
- Delta Lake (delta-rs, append per step), with our Parquet settings and with its defaults;
- Iceberg (pyiceberg, SQL catalog in a local sqlite file, warehouse on the server).

Printed: per-step latency (both tables written and committed; tokenlake also its manifest PUT
alone), the total for N steps, re-extracting one step, objects and bytes, the same with
one-row steps (what a commit costs with almost no data), the Parquet settings read back from
each writer's files, an aggregate scan of `tokens` by each reader, two writers at once, and
which DuckDB extensions load offline. Best of `--repeat` runs, interleaved, with the load
average (other jobs share the machine). The figures and the decision: docs/table-formats.md.

Usage: python -m benchmarks.bench_formats [--steps 8] [--scale 0.0625] [--repeat 3]
Needs the `formats`, `moto`, `s3` and `synth` extras (`make setup` installs all but `formats`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import statistics
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks import bench_formats_writers as bw
from benchmarks import s3server
from tokenlake import Lake, extras, schema
from tokenlake.generator import synth
from tokenlake.read import dump
from tokenlake.transform.tables import build_step_tables

BASE_PROMPTS_PER_STEP = 64  # the `bench` preset: 64 prompts x 8 samples at scale 1
RACE_APPENDS = 6  # appends per writer in the two-writer race
SCAN = "SELECT count(*), avg(lp_diff), max(position) FROM {}"

Writer = Callable[[list[bw.Step], str, dict[str, str], Path], bw.Figures]
WRITERS: dict[str, tuple[Writer, str]] = {  # name -> (writer, prefix of its `tokens` files)
    "tokenlake (manifest)": (bw.bench_tokenlake, "tokenlake/tokens/"),
    "delta-rs our settings, table kept": (
        functools.partial(bw.bench_delta, ours=True, keep=True),
        "delta/tokens/",
    ),
    "delta-rs our settings, URL": (
        functools.partial(bw.bench_delta, ours=True, keep=False),
        "delta/tokens/",
    ),
    "delta-rs its defaults, table kept": (
        functools.partial(bw.bench_delta, ours=False, keep=True),
        "delta/tokens/",
    ),
    "pyiceberg, sqlite catalog": (bw.bench_iceberg, "iceberg/tl/tokens/"),
}


def build_steps(root: Path, steps: int, scale: float) -> list[bw.Step]:
    """Generate a dump (the `bench` preset, no eval files) and build its step tables."""
    spec = dataclasses.replace(
        synth.PRESETS["bench"],
        steps=steps,
        eval_steps=(),
        prompts_per_step=max(1, round(BASE_PROMPTS_PER_STEP * scale)),
    )
    synth.write_dump(root, spec)
    built = []
    for files in dump.discover(root).steps:
        tokens, samples, _ = build_step_tables(files)
        built.append(bw.Step(files, {schema.TOKENS: tokens, schema.SAMPLES: samples}))
    return built


# -- reading -------------------------------------------------------------------------------


def duckdb_over(urls: list[str]) -> object:
    """DuckDB scans a list of objects through fsspec (no extension), as our catalog does."""
    import duckdb
    import s3fs

    with duckdb.connect() as con:
        con.register_filesystem(s3fs.S3FileSystem())
        return con.execute(SCAN.format(f"read_parquet({urls!r}, hive_partitioning=true)"))


def readers(buckets: dict[str, str], env: dict[str, str], folder: Path) -> dict[str, Any]:
    """Each way to scan `tokens`; the DuckDB ones read a file list with no extension."""
    import polars as pl
    from deltalake import DeltaTable

    from tokenlake.serve import catalog
    from tokenlake.store import manifest

    store = Lake(f"s3://{buckets['tokenlake (manifest)']}/tokenlake").store
    delta = f"s3://{buckets['delta-rs our settings, table kept']}/delta/{schema.TOKENS}"
    options = bw.delta_options(env)
    iceberg = bw.iceberg_catalog(folder, buckets["pyiceberg, sqlite catalog"], env)

    def ours() -> object:
        record = manifest.load_manifest(store, bw.RUN)
        assert record is not None
        return duckdb_over([store.url(name) for name in record.files(schema.TOKENS)])

    def catalog_query() -> object:
        with catalog.connect(Lake(f"s3://{buckets['extract_run']}/x").store) as con:
            return con.execute(SCAN.format(schema.TOKENS)).fetchall()

    def iceberg_files() -> list[str]:
        table = iceberg.load_table(f"tl.{schema.TOKENS}")
        return [task.file.file_path for task in table.scan().plan_files()]

    def polars_delta() -> object:
        frame = pl.scan_delta(delta, storage_options=options)
        return frame.select(pl.len(), pl.col("lp_diff").mean(), pl.col("position").max()).collect()

    return {
        "DuckDB read_parquet(manifest's files)": ours,
        "DuckDB read_parquet(DeltaTable.file_uris())": lambda: duckdb_over(
            DeltaTable(delta, storage_options=options).file_uris()
        ),
        "DuckDB read_parquet(iceberg scan's files)": lambda: duckdb_over(iceberg_files()),
        "polars scan_delta": polars_delta,
        "tokenlake catalog.connect (all views) + query": catalog_query,
    }


# -- two writers ---------------------------------------------------------------------------


def _small_table(writer: int, index: int) -> pa.Table:
    return pa.table(
        {
            "writer": pa.array(np.full(100, writer, dtype=np.int32)),
            "value": pa.array(np.arange(100, dtype=np.float32)),
            "rollout_id": pa.array(np.full(100, writer * 1000 + index, dtype=np.int64)),
        }
    )


def _appender(fmt: str, where: str, env: dict[str, str], writer: int) -> list[str]:
    """A child process: RACE_APPENDS appends to one table; returns the errors it met."""
    from deltalake import write_deltalake

    errors = []
    for index in range(RACE_APPENDS):
        rows = _small_table(writer, index)
        try:
            if fmt == "delta":
                write_deltalake(where, rows, mode="append", storage_options=bw.delta_options(env))
            else:
                folder, bucket = where.split("|")
                bw.iceberg_catalog(Path(folder), bucket, env).load_table("race.t").append(rows)
        except Exception as exc:  # noqa: BLE001 - the race's outcome is what we report
            errors.append(f"{type(exc).__name__}: {str(exc)[:160]}")
    return errors


def race(env: dict[str, str], folder: Path) -> list[str]:
    """Two processes append at once to one table; what landed, and what failed."""
    from deltalake import DeltaTable, write_deltalake

    bucket, options = bw.new_bucket(), bw.delta_options(env)
    uri, empty = f"s3://{bucket}/race", _small_table(0, 0).slice(0, 0)
    write_deltalake(uri, empty, storage_options=options)
    catalog = bw.iceberg_catalog(folder, bucket, env)
    catalog.create_namespace_if_not_exists("race")
    catalog.create_table("race.t", schema=empty.schema)
    expected, lines = 2 * RACE_APPENDS * 100, []
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        for fmt, where in (("delta", uri), ("iceberg", f"{folder}|{bucket}")):
            found = [
                e
                for errs in pool.map(_appender, [fmt] * 2, [where] * 2, [env] * 2, [1, 2])
                for e in errs
            ]
            if fmt == "delta":
                table = DeltaTable(uri, storage_options=options)
                rows, extra = table.to_pyarrow_table().num_rows, f", version {table.version()}"
            else:
                rows, extra = catalog.load_table("race.t").scan().to_arrow().num_rows, ""
            lines.append(f"  {fmt}: {rows}/{expected} rows landed{extra}, {len(found)} errors")
            lines += [f"    {error}" for error in found[:2]]
    return lines + [f"  tokenlake: {tokenlake_second_writer()}"]


def tokenlake_second_writer() -> str:
    """tokenlake allows one writer per lake: the second is refused at once, with this text."""
    from tokenlake.errors import LakeError

    url = f"s3://{bw.new_bucket()}/lake"
    with Lake(url).store.lock():
        try:
            with Lake(url).store.lock():
                return "the second writer got the lock (unexpected)"
        except LakeError as exc:
            return f"second writer refused: {str(exc)[:110]}..."


def duckdb_extensions() -> list[str]:
    """Whether DuckDB can load each table-format extension here (no download attempted)."""
    import duckdb

    lines = []
    config: dict[str, Any] = {
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
    }
    for name in ("delta", "iceberg", "ducklake"):
        with duckdb.connect(config=config) as con:
            try:
                con.execute(f"LOAD {name}")
                lines.append(f"  {name}: loads")
            except duckdb.Error as exc:
                lines.append(f"  {name}: {str(exc).splitlines()[0][:150]}")
    return lines


# -- the report ----------------------------------------------------------------------------


def _best(runs: list[bw.Figures]) -> bw.Figures:
    """The repetition with the lowest total, with the lowest rewrite of all."""
    best = dataclasses.replace(min(runs, key=lambda f: f.total))
    best.rewrite = min(f.rewrite for f in runs)
    return best


def figure_lines(figures: list[bw.Figures], tokens: int) -> list[str]:
    lines = [
        f"  {'writer':<34} {'step med':>8} {'max':>7} {'commit':>7} {'total':>7} {'rewrite':>8}"
        f" {'objects':>7} {'parquet':>7} {'B/token':>7} {'meta B':>8}"
    ]
    for f in figures:
        commit = f"{statistics.median(f.commits) * 1e3:5.0f}ms" if f.commits else "      -"
        lines.append(
            f"  {f.name:<34} {statistics.median(f.steps) * 1e3:6.0f}ms {max(f.steps) * 1e3:5.0f}ms"
            f" {commit} {f.total:6.2f}s {f.rewrite * 1e3:6.0f}ms {f.objects:>7}"
            f" {f.data_objects:>7} {f.data_bytes / tokens:7.2f} {f.other_bytes:>8}"
        )
    return lines


def settings_lines(found: dict[str, dict[str, str]]) -> list[str]:
    keys = ["codec", "float", "key", "rows/group", "version", "lineage"]
    widths = [7, 21, 21, 10, 7, 7]
    head = " ".join(f"{k:>{w}}" for k, w in zip(keys, widths, strict=True))
    lines = [f"  {'writer':<34} {head}"]
    for name, got in found.items():
        row = " ".join(f"{got[k]:>{w}}" for k, w in zip(keys, widths, strict=True))
        lines.append(f"  {name:<34} {row}")
    return lines


def _measure(
    steps: list[bw.Step], env: dict[str, str], folder: Path, repeat: int, *, real: bool
) -> dict:
    """Every writer `repeat` times, interleaved (a busier moment slows all of them alike)."""
    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    runs: dict[str, list[bw.Figures]] = {name: [] for name in WRITERS}
    buckets: dict[str, str] = {}
    places: dict[str, Path] = {}
    extract: list[float] = []
    for index in range(repeat):
        for number, (name, (writer, _)) in enumerate(WRITERS.items()):
            buckets[name] = bw.new_bucket()
            places[name] = folder / f"writer{number}-{index}-{len(steps)}"
            places[name].mkdir()
            runs[name].append(writer(steps, buckets[name], env, places[name]))
        if real:  # the real steps: also the whole extraction, by the real code
            buckets["extract_run"] = bw.new_bucket()
            dump_dir = steps[0].files.root
            assert dump_dir is not None
            url = f"s3://{buckets['extract_run']}/x"
            extract.append(
                bw.timed(
                    functools.partial(
                        extract_run, dump_dir, Lake(url).store, ExtractOptions(run_name=bw.RUN)
                    )
                )
            )
    return {"runs": runs, "buckets": buckets, "places": places, "extract": extract}


def run_all(steps: list[bw.Step], folder: Path, repeat: int, tiny: int) -> list[str]:
    tokens = sum(s.tables[schema.TOKENS].num_rows for s in steps)
    with s3server.moto_server() as env:
        full = _measure(steps, env, folder, repeat, real=True)
        small = _measure(bw.tiny_steps(steps, tiny), env, folder, repeat, real=False)
        buckets = full["buckets"]
        found = {name: bw.parquet_settings(buckets[name], p) for name, (_, p) in WRITERS.items()}
        scans = readers(buckets, env, full["places"]["pyiceberg, sqlite catalog"]).items()
        lines = [
            f"Per step: both tables written and committed; best of {repeat}:",
            *figure_lines([_best(r) for r in full["runs"].values()], tokens),
            f"  tokenlake extract_run end to end (read the dump, {len(steps)} commits, catalog"
            f" upload): {min(full['extract']):.2f} s",
            "",
            f"{tiny} steps of one row per table (the cost of a commit itself); best of {repeat}:",
            *figure_lines([_best(r) for r in small["runs"].values()], tiny),
            "",
            "Parquet settings read back from one `tokens` file:",
            *settings_lines(found),
            "",
            f"Aggregate scan of `tokens` ({tokens:,} rows) on the server, best of {repeat}:",
            *[f"  {k:<48} {min(bw.timed(r) for _ in range(repeat)):6.3f} s" for k, r in scans],
            "",
            f"Two processes appending {RACE_APPENDS} times each to one table, at once:",
            *race(env, folder / "race"),
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_formats")
    parser.add_argument("--steps", type=int, default=8, help="training steps (one commit each)")
    parser.add_argument("--scale", type=float, default=1 / 16, help="bench preset samples x this")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (the best is shown)")
    parser.add_argument("--tiny", type=int, default=32, help="one-row steps to commit")
    args = parser.parse_args(argv)
    if min(args.steps, args.repeat, args.tiny) < 1 or args.scale <= 0:
        parser.error("--steps, --repeat and --tiny must be at least 1, --scale above 0")
    for module, extra in (("deltalake", "formats"), ("pyiceberg", "formats"), ("moto", "moto")):
        extras.require(module, extra, "The table-format benchmark")
    extras.require("s3fs", "s3", "The table-format benchmark")
    extras.require_torch("The table-format benchmark")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="tokenlake-formats-") as tmp:
        folder = Path(tmp)
        steps = build_steps(folder / "dump", args.steps, args.scale)
        tokens = statistics.mean(s.tables[schema.TOKENS].num_rows for s in steps)
        samples = steps[0].tables[schema.SAMPLES].num_rows
        print(f"{len(steps)} steps of {tokens:,.0f} tokens and {samples} samples on average;")
        print(f"{os.cpu_count()} cores, load average {load} at the start")
        (folder / "race").mkdir()
        lines = run_all(steps, folder, args.repeat, args.tiny)
    print("\n".join(lines))
    print("\nDuckDB extensions, loaded offline (no download):", *duckdb_extensions(), sep="\n")
    print("\nload average at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
