"""`make bench`: generate realistic dumps in a temporary directory and print throughput figures.

Each measured pipeline runs in a fresh subprocess so that its wall time, CPU time and peak RSS
(its own and its workers') are its alone. Figures printed:
- generation time of each dump (context, not a goal);
- extraction: response tokens/s by wall clock and per CPU second, peak RSS of the main process
  and of the largest worker, bytes per token on disk — for tokenlake with 1 and 2 workers, and
  for a baseline pipeline (torch.load each file + concatenate + write with the same Parquet
  settings), with the ratios;
- the same for slime's format 2, NeMo-RL's and prime-rl's layouts of the batches (`--formats`);
- every aggregate view's time as a ratio to a plain aggregate scan of `tokens` in the same\n  DuckDB process (interleaved, best of 5), so a busy machine slows both sides alike;
- the rollups (docs/rollups.md): their share of extraction time and of the lake's bytes, every
  view and audit's seconds on the bench lake and on one with a quarter of its tokens at the same
  steps and samples (shorter responses), with the ratio, and the report's build time on both;
- the explorer (`benchmarks/bench_explorer.py`): each page's data from the server, the page of
  the longest sample, the first page drawn in headless Chromium, and the runs and step pages
  on lakes of 4 and 100 small steps.

Usage: python -m benchmarks.bench [--scale 1.0] [--keep DIR]\n       python -m benchmarks.bench --views LAKE   (only the view ratios of an existing lake)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tokenlake import Lake, extras, schema
from tokenlake.generator import synth
from tokenlake.load import write
from tokenlake.read import dump
from tokenlake.serve import catalog, sql_views
from tokenlake.transform.flatten import first_occurrence_column, turn_index_column

BASE_PROMPTS_PER_STEP = 64  # x 8 samples per prompt = 512 samples per step at scale 1


def scaled_spec(preset: str, scale: float) -> synth.DumpSpec:
    """The bench preset with its samples per step multiplied by `scale`."""
    spec = synth.PRESETS[preset]
    prompts = max(1, round(BASE_PROMPTS_PER_STEP * scale))
    return dataclasses.replace(spec, prompts_per_step=prompts)


def _high_water_mb() -> float:
    """This process's peak RSS since exec (VmHWM; ru_maxrss would include the parent's peak
    inherited through fork)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _usage() -> dict[str, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "cpu": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
        "rss_main_mb": _high_water_mb(),
        "rss_worker_mb": kids.ru_maxrss / 1024,  # largest worker (spawned: fresh processes)
    }


# The run name of every lake the bench extracts (the commands it times name it).
BENCH_RUN = "bench"


def measure_extract(dump_dir: Path, lake: Path, workers: int) -> dict[str, Any]:
    """Child process: tokenlake's extraction."""
    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    started = time.perf_counter()
    store = Lake(lake).store
    summary = extract_run(dump_dir, store, ExtractOptions(run_name=BENCH_RUN, workers=workers))
    wall = time.perf_counter() - started
    if summary.failed:
        raise SystemExit(f"bench extraction failed: {summary.failed}")
    return {"wall": wall, "tokens": summary.tokens, **_usage()}


def measure_baseline(dump_dir: Path, out: Path, weights_only: bool = True) -> dict[str, Any]:
    """Child process: the straightforward pipeline (no CP/PP resolution; TP de-duplicated);
    `weights_only=False` is the unsafe one (what miles' own reader does: any pickle runs)."""
    started = time.perf_counter()
    tokens = 0
    for files in dump.discover(dump_dir).steps:
        table = _baseline_step(files, weights_only)
        tokens += table.num_rows
        path = out / f"{files.label}.parquet"
        write.write_parquet(path, schema.TOKENS, table, {})
    return {"wall": time.perf_counter() - started, "tokens": tokens, **_usage()}


def _baseline_step(files: dump.StepFiles, weights_only: bool = True) -> pa.Table:
    import torch

    safe = weights_only
    rollout = torch.load(files.rollout_file, weights_only=safe, mmap=True, map_location="cpu")
    position_of = {s["index"]: i for i, s in enumerate(rollout["samples"])}
    shards: dict[tuple[int, ...], dict[str, Any]] = {}
    for _, path in files.train_files:
        data = torch.load(path, weights_only=safe, mmap=True, map_location="cpu")["rollout_data"]
        shards.setdefault(tuple(data["sample_indices"]), data)  # lowest rank of a TP group
    if not shards:
        return _baseline_rollout_only(files, rollout["samples"])
    return pa.concat_tables([_baseline_shard(files, data, position_of) for data in shards.values()])


def _baseline_shard(files: dump.StepFiles, data: dict[str, Any], position_of: dict) -> pa.Table:
    import torch

    lengths = torch.tensor(data["response_lengths"], dtype=torch.int64)
    positions = torch.tensor([position_of[i] for i in data["sample_indices"]], dtype=torch.int32)
    total = int(lengths.sum())
    starts = torch.cumsum(lengths, 0) - lengths
    mask = torch.cat(data["loss_masks"]).numpy() > 0
    response_ids = torch.cat(
        [t[len(t) - r :] for t, r in zip(data["tokens"], lengths.tolist(), strict=True)]
    )
    columns: dict[str, Any] = {
        schema.EVALUATION: pa.array(np.zeros(total, dtype=bool)),
        schema.BATCH_POSITION: pa.array(torch.repeat_interleave(positions, lengths).numpy()),
        schema.SAMPLE_INDEX: pa.array(
            torch.repeat_interleave(torch.tensor(data["sample_indices"]), lengths).numpy()
        ),
        schema.POSITION: pa.array(
            (torch.arange(total) - torch.repeat_interleave(starts, lengths)).int().numpy()
        ),
        schema.TOKEN_ID: pa.array(response_ids.numpy()),
        schema.LOSS_MASK: pa.array(mask.astype(np.int8)),
    }
    columns[schema.TURN_INDEX] = turn_index_column(columns[schema.LOSS_MASK], starts.numpy())
    fields = {"rollout_log_probs": schema.ROLLOUT_LOG_PROB, **schema.TRAIN_TOKEN_FIELDS}
    for name, column in fields.items():
        values = torch.cat(data[name]).float().numpy() if name in data else None
        columns[column] = (
            pa.array(values, mask=~mask) if values is not None else pa.nulls(total, pa.float32())
        )
    lp, rlp = data.get("log_probs"), data.get("rollout_log_probs")
    diff = (torch.cat(lp) - torch.cat(rlp)).numpy() if lp and rlp else None
    columns[schema.LP_DIFF] = (
        pa.array(diff, mask=~mask) if diff is not None else pa.nulls(total, pa.float32())
    )
    columns[schema.FIRST_OCCURRENCE] = first_occurrence_column(columns, lengths.numpy())
    columns[schema.TOKEN_VERSION] = pa.nulls(total, pa.string())  # no per-token versions here
    columns[schema.TOKEN_STALENESS] = pa.nulls(total, pa.int64())
    columns[schema.SUPPORT_SIZE] = pa.nulls(total, pa.int32())
    for field in schema.TOKENS_SCHEMA:  # columns this script does not derive are NULL
        columns.setdefault(field.name, pa.nulls(total, field.type))
    return pa.table(columns, schema=schema.TOKENS_SCHEMA)


def _baseline_rollout_only(files: dump.StepFiles, samples: list[dict[str, Any]]) -> pa.Table:
    rows: dict[str, list[Any]] = {name: [] for name in schema.TOKENS_SCHEMA.names}
    for position, sample in enumerate(samples):
        r = int(sample["response_length"])
        rows[schema.TOKEN_ID].extend(sample["tokens"][len(sample["tokens"]) - r :])
        rows[schema.ROLLOUT_LOG_PROB].extend(sample["rollout_log_probs"] or [None] * r)
        rows[schema.BATCH_POSITION].extend([position] * r)
        rows[schema.SAMPLE_INDEX].extend([sample["index"]] * r)
        rows[schema.POSITION].extend(range(r))
    total = len(rows[schema.TOKEN_ID])
    rows[schema.EVALUATION] = [files.evaluation] * total
    for name in schema.TOKENS_SCHEMA.names:
        if not rows[name]:
            rows[name] = [None] * total
    return pa.table(rows, schema=schema.TOKENS_SCHEMA)


def installed_env() -> dict[str, str]:
    """The environment of a measured process: as under an installed tokenlake, whose modules'
    bytecode is cached (`cache_bytecode`). PYTHONDONTWRITEBYTECODE, which some shells set (this
    project's sessions do), would make every process compile tokenlake's modules again: 0.3 s
    of an extraction's imports and about as much in the modules it imports later, 1.0 of 5.8 s
    of CPU on `bench` at scale 0.25, where the scripts compile only the few they import."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def cache_bytecode() -> None:
    """Compile tokenlake's and the bench's modules once, as `pip install` does for an installed
    package, so no measured process pays for it (`installed_env`)."""
    import compileall

    here = Path(__file__).resolve().parents[1]  # the folder `tokenlake` and `benchmarks` are in
    for package in ("tokenlake", "benchmarks"):
        compileall.compile_dir(here / package, quiet=1)


def _run_child(*args: str) -> dict[str, Any]:
    here = str(Path(__file__).resolve().parents[1])  # the folder `benchmarks` is found in
    env = {
        **installed_env(),
        "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])),
    }
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench", *args], capture_output=True, text=True, env=env
    )
    if out.returncode != 0:  # the child's own error, not only its exit status
        raise SystemExit(f"benchmarks.bench {' '.join(args)} failed:\n{out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def machine_ceiling(repeat: int = 3, n: int = 20_000_000) -> list[float]:
    """Throughput of 2 processes over 1 on pure-Python work: the most `--workers 2` can gain.

    On shared 2-vCPU machines this is often well under 2 (measured here: 1.33-1.60).
    """
    from multiprocessing import get_context

    ratios = []
    with get_context("spawn").Pool(2) as pool:
        pool.map(_spin, [1, 1])  # both processes started
        for _ in range(repeat):
            started = time.perf_counter()
            _spin(n)
            one = time.perf_counter() - started
            started = time.perf_counter()
            pool.map(_spin, [n, n])
            ratios.append(2 * one / (time.perf_counter() - started))
    return ratios


def _disk_bytes(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


# The yardstick every view is compared with: one plain aggregate pass over `tokens`.
SCAN_SQL = (
    "SELECT run, rollout_id, count(*), avg(lp_diff), max(abs(lp_diff)) FROM tokens"
    " WHERE NOT evaluation GROUP BY ALL"
)
# Views that return one row per token or a constant row are not aggregates; they are not timed.
# Not aggregates: the settings row, and the views of one row per token (their Grain headers),
# whose `SELECT *` lists millions of rows (`audit_tokens` keeps only a few candidate rows).
_NOT_AGGREGATES = (
    "drift_settings",
    "drift_tokens",
    "drift_teacher_tokens",
    "drift_token_samples",
    "trained_tokens",
)


def view_ratios(lake: Path, repeat: int = 5) -> list[tuple[str, float, float]]:
    """Each aggregate view's time over the time of `SCAN_SQL`, in one DuckDB process.

    Runs are interleaved (scan, every view, scan, every view, ...) and the best of `repeat`
    is kept for each, so a busy shared machine slows both sides of a ratio alike.

    Returns:
        (view, best seconds, best seconds / best scan seconds), in view-file order.
    """
    names = [p.stem for p in sql_views.iter_view_files() if p.stem not in _NOT_AGGREGATES]
    queries = {"scan": SCAN_SQL, **{n: f"SELECT * FROM {n}" for n in names}}
    best = best_seconds(lake, queries, repeat, lambda con, sql: con.execute(sql).fetchall())
    return [(n, best[n], best[n] / best["scan"]) for n in ["scan", *names]]


def best_seconds(
    lake: Path, queries: dict[str, str], repeat: int, fetch: Callable[[Any, str], object]
) -> dict[str, float]:
    """Best seconds of each query over `repeat` interleaved rounds in one DuckDB process,
    after a warm-up round (the file cache and DuckDB's metadata)."""
    con = catalog.connect(Lake(lake).store)
    best = dict.fromkeys(queries, float("inf"))
    try:
        for sql in queries.values():
            fetch(con, sql)
        for _ in range(repeat):
            for name, sql in queries.items():
                started = time.perf_counter()
                fetch(con, sql)
                best[name] = min(best[name], time.perf_counter() - started)
    finally:
        con.close()
    return best


def print_view_ratios(lake: Path, repeat: int = 5) -> None:
    """One line per aggregate view: best time and its ratio to the plain scan of `tokens`."""
    for name, seconds, ratio in view_ratios(lake, repeat):
        print(f"  view {name:<20} {seconds:7.3f} s  {ratio:6.1f}x the plain scan")


def _fmt_run(name: str, fig: dict[str, Any], token_bytes: int | None) -> str:
    per_cpu = fig["tokens"] / fig["cpu"] if fig["cpu"] else float("nan")
    line = (
        f"  {name:<22} {fig['wall']:7.2f} s  {fig['tokens'] / fig['wall'] / 1e6:6.2f} M tok/s wall"
        f"  {per_cpu / 1e6:6.2f} M tok/CPU-s  peak RSS main {fig['rss_main_mb']:6.0f} MB,"
        f" worker {fig['rss_worker_mb']:6.0f} MB"
    )
    if token_bytes is not None:
        line += f"  {token_bytes / fig['tokens']:5.1f} B/token"
    return line


def _wait_until_settled(dump_dir: Path) -> None:
    """Measure a finished run: files younger than `pt.FRESH_SECONDS` are read into memory
    (a live writer may still truncate them), older ones memory-mapped; mixing both would make
    the first runs of a figure slower than the rest."""
    from tokenlake.read import pt

    newest = max(p.stat().st_mtime for p in _dump_files(dump_dir))
    time.sleep(max(0.0, newest + pt.FRESH_SECONDS + 1 - time.time()))


def _dump_files(dump_dir: Path) -> list[Path]:
    """The files extraction reads: `.pt` files, NeMo-RL's logged batches, or prime-rl's token
    exports."""
    return [
        *dump_dir.rglob("*.pt"),
        *dump_dir.glob("*_data_step*.jsonl"),
        *dump_dir.glob("token_exports/step_*/rank_*.jsonl"),
    ]


def _best_extract(dump_dir: Path, lake: Path, workers: int, repeat: int) -> dict[str, Any]:
    """The fastest of `repeat` extractions into a fresh lake (the machine is shared and noisy)."""
    runs = []
    for attempt in range(repeat):
        target = lake if attempt == repeat - 1 else lake.with_name(f"{lake.name}-try{attempt}")
        runs.append(_run_child("_extract", str(dump_dir), str(target), str(workers)))
        if target != lake:
            shutil.rmtree(target, ignore_errors=True)
    return min(runs, key=lambda fig: fig["wall"])


def bench_variant(
    root: Path, preset: str, scale: float, baseline: bool, repeat: int
) -> dict[str, Any]:
    """Generate one dump and print its figures; returns the `--workers 1` extraction's."""
    spec = scaled_spec(preset, scale)
    dump_dir = root / preset
    started = time.perf_counter()
    synth.write_dump(dump_dir, spec)
    generated = time.perf_counter() - started
    dump_mb = _disk_bytes(_dump_files(dump_dir)) / 1e6
    _wait_until_settled(dump_dir)
    print(
        f"\n{preset} ({spec.framework}): {spec.steps} steps x {spec.samples_per_step} samples,"
        f" R in {spec.response_length[0]}..{spec.response_length[1]}, DP {spec.dp} x TP"
        f" {spec.tp} x CP {spec.cp}; {dump_mb:,.0f} MB of dump files written in {generated:.1f} s"
    )
    figures: dict[str, dict[str, Any]] = {}
    for workers in (1, 2):
        lake = root / f"lake-{preset}-{workers}"
        fig = _best_extract(dump_dir, lake, workers, repeat)
        size = _disk_bytes([Path(p) for p in catalog.table_files(Lake(lake).store, schema.TOKENS)])
        figures[f"tokenlake --workers {workers}"] = fig
        print(_fmt_run(f"tokenlake --workers {workers}", fig, size))
    if baseline:
        for mode, label in (("_baseline", "safe script"), ("_baseline_unsafe", "unsafe script")):
            out = root / f"{mode}-{preset}"
            fig = _run_child(mode, str(dump_dir), str(out))
            figures[label] = fig
            print(_fmt_run(label, fig, _disk_bytes(list(out.glob("*.parquet")))))
        print_script_ratios(figures)
    one, two = figures["tokenlake --workers 1"], figures["tokenlake --workers 2"]
    print(f"  2 workers vs 1: {one['wall'] / two['wall']:.2f}x")
    print(f"  views vs a plain aggregate scan of tokens ({one['tokens']:,} token rows), best of 5:")
    print_view_ratios(root / f"lake-{preset}-2")
    return one


# Goals of issue 34 (docs/performance.md): extraction CPU per token against the unsafe script's,
# wall against both scripts' with 2 workers, a step's fixed CPU, every command's CPU.
UNSAFE_CPU_GOAL = 0.5
SAFE_WALL_GOAL = 10.0
UNSAFE_WALL_GOAL = 3.0
STEP_FIXED_CPU_GOAL = 0.05
COMMAND_CPU_GOALS = {"query": 0.3, "audit": 0.3, "verify": 0.3, "tag": 0.3, "report": 1.0}
MANY_STEPS_FACTOR = 1.5
# The step count of the many-small-steps lake the full bench measures (`--steps N` alone: N).
SMALL_STEPS = 100


def _against(value: float, goal: float, at_most: bool = True) -> str:
    met = value <= goal if at_most else value >= goal
    return f"goal {'<=' if at_most else '>='} {goal:g}: {'met' if met else 'NOT met'}"


def print_script_ratios(figures: dict[str, dict[str, Any]]) -> None:
    """tokenlake against both scripts: CPU per token (goal: half the unsafe script's) and
    wall time with 2 workers (goals: 10x the safe script, 3x the unsafe one)."""
    for name in ("tokenlake --workers 1", "tokenlake --workers 2"):
        ours = figures[name]
        cpu = (ours["cpu"] / ours["tokens"]) / (
            figures["unsafe script"]["cpu"] / figures["unsafe script"]["tokens"]
        )
        print(
            f"  {name}: CPU per token {cpu:.2f}x the unsafe script's ({_against(cpu, UNSAFE_CPU_GOAL)})"
        )
    two = figures["tokenlake --workers 2"]["wall"]
    for label, goal in (("safe script", SAFE_WALL_GOAL), ("unsafe script", UNSAFE_WALL_GOAL)):
        speedup = figures[label]["wall"] / two
        print(
            f"  --workers 2 wall: {speedup:.2f}x faster than the {label}"
            f" ({_against(speedup, goal, at_most=False)}; an idle machine's goal)"
        )


# The stages of one step's extraction, as the functions that do them: (the end of the module's
# path, the function's name), one function each, so a stage's cumulative CPU under cProfile
# (which adds its own overhead: shares, not absolute figures) is counted once (the formats'
# `read_step` calls the format's own `read_step`: by name alone the read counted twice).
STAGES = {
    "read": ("tokenlake/read/formats.py", "read_step"),
    "flatten": ("tokenlake/transform/tables.py", "build_step"),  # less its read, below
    "rollups": ("tokenlake/serve/rollups.py", "compute_steps"),  # compute_step calls it
    "write": ("tokenlake/orchestrate/step.py", "_write_step"),
    "commit": ("tokenlake/store/manifest.py", "save_manifest"),
    "catalog": ("tokenlake/serve/catalog.py", "build_catalog"),
}


def measure_stages(dump_dir: Path, lake: Path) -> dict[str, Any]:
    """Child process: one `--workers 1` extraction under cProfile (CPU clock); the CPU seconds
    of each stage, of the whole, and the steps."""
    import cProfile
    import pstats

    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    profile = cProfile.Profile(time.process_time)
    summary = profile.runcall(extract_run, dump_dir, Lake(lake).store, ExtractOptions(workers=1))
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return {**stage_seconds(stats), "steps": len(summary.steps), "tokens": summary.tokens}


def stage_seconds(stats: dict[tuple[str, int, str], tuple[Any, ...]]) -> dict[str, Any]:
    """Each stage's cumulative CPU seconds from cProfile's stats (`pstats.Stats(...).stats`),
    and the whole profile's."""
    stages = {stage: 0.0 for stage in STAGES}
    for (path, _, function), (_, _, _, cumulative, _) in stats.items():
        for stage, (module, name) in STAGES.items():
            if function == name and Path(path).as_posix().endswith(module):
                stages[stage] += cumulative
    stages["flatten"] -= stages["read"]
    total = sum(v[2] for v in stats.values())
    return {"stages": stages, "total": total}


def print_stages(dump_dir: Path, lake: Path) -> dict[str, Any]:
    """The per-stage profile of one extraction (docs/performance.md holds each stage's floor)."""
    fig = _run_child("_profile", str(dump_dir), str(lake))
    steps, tokens = fig["steps"], fig["tokens"]
    print(f"  where the CPU goes (cProfile, --workers 1, {steps} steps, {tokens:,} tokens):")
    for stage, seconds in fig["stages"].items():
        print(
            f"    {stage:<8} {seconds:7.2f} s  {seconds / fig['total']:5.1%}"
            f"  {seconds / steps * 1000:7.1f} ms/step  {seconds / tokens * 1e6:6.2f} us/token"
        )
    print(f"    {'all':<8} {fig['total']:7.2f} s")
    shutil.rmtree(lake, ignore_errors=True)
    return fig


def command_latencies(lake: Path, out: Path, repeat: int = 3) -> dict[str, float]:
    """Best CPU of each command the issue names, on `lake` (extracted as run BENCH_RUN)."""
    commands = {
        "query": ["query", str(lake), "select count(*) from step_stats"],
        "audit": ["audit", str(lake)],
        "verify": ["verify", str(lake)],
        "tag": ["tag", str(lake), BENCH_RUN, "bench={attempt}"],  # a new value each time
        "report": ["report", str(lake), "--output", str(out / "report.html")],
    }
    best = {}
    for name, argv in commands.items():
        best[name] = min(
            command_cpu([a.format(attempt=attempt) if a.startswith("bench=") else a for a in argv])
            for attempt in range(repeat)
        )
    return best


# Exit codes of a command that did its work: audit and verify exit 1 on findings.
_FINDINGS_EXIT = {"audit": 1, "verify": 1}


def command_cpu(argv: list[str]) -> float:
    """CPU seconds (user + sys) of one `python -m tokenlake` process, start-up included.

    Raises:
        SystemExit: The command failed (an `Error:` line, or an exit code other than 0 and
            its findings' code): a failed command's CPU is no figure of it.
    """
    env = installed_env()  # without it each command compiles tokenlake again: 0.05-0.1 s
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-m", "tokenlake", *argv],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    allowed = {0, _FINDINGS_EXIT.get(argv[0], 0)}
    if (
        done.returncode not in allowed
        or done.stderr.startswith("Error:")
        or "\nError:" in done.stderr
    ):
        raise SystemExit(
            f"tokenlake {' '.join(argv)} failed (exit {done.returncode}):\n{done.stderr.strip()}"
        )
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench_small_steps(root: Path, steps: int) -> None:
    """A step's fixed cost and every command's: a dump of `steps` steps of 4 samples (DP 2),
    extracted with 1 worker; the example lake and that lake timed command by command."""
    os.environ["TOKENLAKE_CACHE"] = str(root / "cache")  # readers' kept catalogs: the bench's
    small = root / "small"
    spec = synth.DumpSpec(
        steps=steps, prompts_per_step=2, samples_per_prompt=2, dp=2, eval_steps=()
    )
    synth.write_dump(small, spec)
    _wait_until_settled(small)
    print(f"\nsmall steps: {steps} steps x 4 samples, DP 2")
    fig = _run_child("_extract", str(small), str(root / "lake-small"), "1")
    per_step = fig["cpu"] / steps
    lake = root / "lake-small"
    files = sum(1 for p in lake.rglob("*.parquet"))
    size = _disk_bytes([Path(p) for p in catalog.table_files(Lake(lake).store, schema.TOKENS)])
    print(
        f"  extract --workers 1: {fig['cpu']:.2f} s CPU, {per_step * 1000:.0f} ms per step"
        f" ({_against(per_step, STEP_FIXED_CPU_GOAL)} of fixed cost, tokens ~nil);"
        f" {files:,} Parquet files ({files / steps:.0f} a step), tokens {size / fig['tokens']:.0f} B/token"
    )
    print_stages(small, root / "lake-small-profile")
    example = root / "example"
    subprocess.run(
        [sys.executable, "-m", "tokenlake", "generate", str(example), "--preset", "example"],
        check=True,
        capture_output=True,
    )
    example_lake = root / "lake-example"
    _run_child("_extract", str(example), str(example_lake), "1")
    on_example = command_latencies(example_lake, root)
    on_small = command_latencies(lake, root)
    print(
        f"  command CPU (process start included, best of 3; the first builds the reader's"
        f" catalog, kept for the next): example lake, {steps}-step lake"
    )
    for name, goal in COMMAND_CPU_GOALS.items():
        a, b = on_example[name], on_small[name]
        print(
            f"    {name:<7} {a:5.2f} s ({_against(a, goal)})  {b:5.2f} s"
            f" ({b / a:.2f}x; {_against(b / a, MANY_STEPS_FACTOR)})"
        )


# Goals of docs/rollups.md: seconds per per-step and per-sample view on the bench lake, and the
# largest ratio of a view's time when the lake has 4x the tokens at the same steps.
VIEW_SECONDS_GOAL = 0.1
GROWTH_GOAL = 1.5


def timed_queries(lake: Path, repeat: int = 5) -> dict[str, float]:
    """Best seconds of every view (but the token-level ones) and every audit, one process,
    each to an Arrow table (what a dataframe or a BI driver fetches): Python tuples would add
    ~1 µs a value, the client's cost, not the view's (`drift_by_token` has a row per token id)."""
    token_views = {
        "tokens",
        "trained_tokens",
        "drift_tokens",
        "drift_token_samples",
        "drift_teacher_tokens",
    }
    queries = {
        p.stem: f"SELECT * FROM {p.stem}"
        for p in sql_views.iter_view_files()
        if p.stem not in token_views
    }
    queries.update(
        {f"audit {p.stem}": p.read_text(encoding="utf-8") for p in sql_views.iter_audit_files()}
    )
    return best_seconds(lake, queries, repeat, lambda con, sql: con.sql(sql).to_arrow_table())


def rollup_cost(lake: Path) -> tuple[float, int, int]:
    """Seconds `compute_step` takes over every step of the lake (as extraction runs it:
    single-threaded, from the step's tables in memory), the rollups' bytes, the lake's."""
    import pyarrow.parquet as pq

    from tokenlake.serve import rollups
    from tokenlake.store import manifest

    seconds = 0.0
    for record in manifest.load_all(Lake(lake).store):
        for step in record.steps.values():
            tokens = pq.read_table(lake / step.files[schema.TOKENS])
            samples = pq.read_table(lake / step.files[schema.SAMPLES])
            rollups.compute_step(tokens, samples, record.run, step.rollout_id)  # warm
            started = time.perf_counter()
            rollups.compute_step(tokens, samples, record.run, step.rollout_id)
            seconds += time.perf_counter() - started
    rollup_bytes = _disk_bytes(list((lake / schema.ROLLUP_DIR).rglob("*.parquet")))
    lake_bytes = _disk_bytes([p for p in lake.rglob("*.parquet")])
    return seconds, rollup_bytes, lake_bytes


def report_seconds(lake: Path, out: Path, repeat: int = 2) -> float:
    """Best wall seconds of `build_report` on the lake (imports warmed by a first build)."""
    from tokenlake.serve.report import build_report

    store = Lake(lake).store
    build_report(store, out)
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        build_report(store, out)
        best = min(best, time.perf_counter() - started)
    return best


def bench_rollups(root: Path, scale: float, extract_fig: dict[str, Any]) -> None:
    """Rollup figures: cost at extraction, and views at two token counts (same steps)."""
    large = root / "lake-bench-1"
    seconds, rollup_bytes, lake_bytes = rollup_cost(large)
    print("\nrollups (docs/rollups.md):")
    print(
        f"  computed in {seconds:.2f} s over the bench lake's steps, single-threaded:"
        f" {seconds / extract_fig['wall'] * 100:.1f} % of `--workers 1` extraction"
        f" ({extract_fig['wall']:.2f} s wall), {seconds / extract_fig['cpu'] * 100:.1f} % of its"
        f" CPU; {rollup_bytes / 1e6:.2f} MB, {rollup_bytes / lake_bytes * 100:.2f} % of the lake's"
        " Parquet bytes"
    )
    spec = scaled_spec("bench", scale)
    low, high = spec.response_length
    short = dataclasses.replace(spec, response_length=(max(1, low // 4), max(1, high // 4)))
    small_dump, small = root / "bench-short", root / "lake-bench-short"
    synth.write_dump(small_dump, short)
    _run_child("_extract", str(small_dump), str(small), "2")
    shutil.rmtree(small_dump, ignore_errors=True)
    tokens = {
        lake: sum(s.tokens for r in _records(lake) for s in r.steps.values())
        for lake in (small, large)
    }
    print(
        f"  views and audits, best of 5: a lake of {tokens[small]:,} tokens, then the bench lake"
        f" ({tokens[large]:,} tokens, {tokens[large] / tokens[small]:.1f}x) at the same"
        f" {spec.steps} steps x {spec.samples_per_step} samples"
    )
    before, after = timed_queries(small), timed_queries(large)
    for name in before:
        growth = after[name] / before[name]
        flags = []
        if after[name] > VIEW_SECONDS_GOAL:
            flags.append(f"over {VIEW_SECONDS_GOAL} s")
        if growth > GROWTH_GOAL:
            flags.append(f"grows over {GROWTH_GOAL}x")
        note = f"  <- {', '.join(flags)}" if flags else ""
        print(f"  {name:<36} {before[name]:7.3f} s -> {after[name]:7.3f} s  {growth:5.2f}x{note}")
    worst = max(after, key=lambda n: after[n] / before[n])
    slowest = max(after, key=lambda n: after[n])
    print(
        f"  slowest on the bench lake: {after[slowest]:.3f} s ({slowest});"
        f" largest growth {after[worst] / before[worst]:.2f}x ({worst})"
    )
    print_step_growth(root)
    small_report = report_seconds(small, root / "report-short.html")
    large_report = report_seconds(large, root / "report.html")
    print(
        f"  report build: {small_report:.2f} s -> {large_report:.2f} s ({large_report / small_report:.2f}x)"
    )
    bench_explorer(root, large)


def bench_explorer(root: Path, lake: Path) -> None:
    """The explorer's figures (docs/performance.md): pages' data, the longest sample's page,
    the first draw in Chromium, and the pages on lakes of 4 and 100 small steps."""
    from benchmarks import bench_explorer as explorer

    print("\nexplorer (docs/explorer.md):")
    explorer.print_explorer(lake, "the bench lake")
    explorer.print_step_growth(small_step_lakes(root, EXPLORER_STEP_COUNTS))


STEP_COUNTS = (4, 32)
# The explorer's goal is stated at 100 steps (issue 32): its pages on lakes of 4 and 100.
EXPLORER_STEP_COUNTS = (4, 100)


def small_step_lakes(root: Path, counts: tuple[int, ...] = STEP_COUNTS) -> dict[int, Path]:
    """Lakes of `counts` small steps, alike but for their number of steps (made once)."""
    lakes = {}
    for steps in counts:
        lake = root / f"lake-steps-{steps}"
        if not lake.exists():
            spec = dataclasses.replace(
                scaled_spec("bench", 1 / 16), steps=steps, response_length=(16, 256)
            )
            dump_dir = root / f"steps-{steps}"
            synth.write_dump(dump_dir, spec)
            _run_child("_extract", str(dump_dir), str(lake), "2")
            shutil.rmtree(dump_dir, ignore_errors=True)
        lakes[steps] = lake
    return lakes


def print_step_growth(root: Path) -> None:
    """Views on two lakes of small steps that differ only in their number of steps: what a
    view costs per step (rollup files read), for docs/scale.md's projection."""
    times = {steps: timed_queries(lake) for steps, lake in small_step_lakes(root).items()}
    low, high = STEP_COUNTS
    print(f"  views and audits on lakes of {low} and {high} small steps (per added step):")
    for name in times[low]:
        slope = (times[high][name] - times[low][name]) / (high - low)
        print(
            f"  {name:<36} {times[low][name]:7.3f} s -> {times[high][name]:7.3f} s"
            f"  {slope * 1000:6.2f} ms/step"
        )


def _records(lake: Path) -> list[Any]:
    from tokenlake.store import manifest

    return manifest.load_all(Lake(lake).store)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench")
    parser.add_argument("--scale", type=float, default=1.0, help="samples per step x this")
    parser.add_argument("--keep", type=Path, help="keep dumps and lakes in this directory")
    parser.add_argument(
        "--repeat", type=int, default=2, help="tokenlake runs per figure; the best is shown"
    )
    parser.add_argument("--views", type=Path, help="only print the view ratios of this lake")
    parser.add_argument(
        "--explorer",
        action="store_true",
        help="only the explorer's figures (extraction of `bench`, then its pages)",
    )
    parser.add_argument(
        "--rollups",
        action="store_true",
        help="only the rollup figures (extraction of `bench`, then views at two token counts)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        help="only the fixed cost: a dump of this many 4-sample steps, its per-stage profile,"
        " then every command's CPU on the example lake and on that lake",
    )
    parser.add_argument(
        "--formats",
        nargs="*",
        default=["bench-slime-v2", "bench-nemo-rl", "bench-prime-rl"],
        help="presets of the other dump formats to measure too (none: miles only)",
    )
    args, rest = parser.parse_known_args(argv)
    if args.views is not None:
        print_view_ratios(args.views)
        return
    if rest and rest[0] in ("_extract", "_baseline", "_baseline_unsafe", "_profile"):
        mode, dump_dir, out = rest[0], Path(rest[1]), Path(rest[2])
        if mode == "_extract":
            fig = measure_extract(dump_dir, out, int(rest[3]))
        elif mode == "_profile":
            fig = measure_stages(dump_dir, out)
        else:
            fig = measure_baseline(dump_dir, out, weights_only=mode == "_baseline")
        print(json.dumps(fig))
        return
    cache_bytecode()
    if args.steps is not None:
        root = args.keep or Path(tempfile.mkdtemp(prefix="tokenlake-bench-"))
        try:
            bench_small_steps(root, args.steps)
        finally:
            if args.keep is None:
                shutil.rmtree(root, ignore_errors=True)
        return
    try:
        extras.require_torch("The benchmark (its dumps and baseline)")
    except extras.MissingDependencyError as exc:
        sys.exit(f"Error: {exc}")
    root = args.keep or Path(tempfile.mkdtemp(prefix="tokenlake-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    print(
        f"tokenlake bench, scale {args.scale:g}, in {root}. Parquet: {write.COMPRESSION}"
        f" level {write.COMPRESSION_LEVEL}, row groups {write.ROW_GROUP_SIZE:,} rows;"
        f" DuckDB default threads; tokenlake best of {args.repeat} runs, baseline 1 run."
    )
    ratios = sorted(machine_ceiling(repeat=5))
    print(
        "Machine ceiling for 2 workers (2 processes vs 1 on a pure-Python loop):"
        f" median {ratios[2]:.2f}x, range {ratios[0]:.2f}-{ratios[-1]:.2f}x"
    )
    try:
        if args.explorer:
            synth.write_dump(root / "bench", scaled_spec("bench", args.scale))
            _run_child("_extract", str(root / "bench"), str(root / "lake-bench-1"), "2")
            bench_explorer(root, root / "lake-bench-1")
            return
        if args.rollups:
            spec = scaled_spec("bench", args.scale)
            synth.write_dump(root / "bench", spec)
            _wait_until_settled(root / "bench")
            one = _best_extract(root / "bench", root / "lake-bench-1", 1, args.repeat)
            bench_rollups(root, args.scale, one)
            return
        one = bench_variant(root, "bench", args.scale, baseline=True, repeat=args.repeat)
        print_stages(root / "bench", root / "lake-bench-profile")
        bench_rollups(root, args.scale, one)
        bench_variant(root, "bench-cp", args.scale, baseline=False, repeat=args.repeat)
        for preset in args.formats:  # the other frameworks' layouts of the same batches
            bench_variant(root, preset, args.scale, baseline=False, repeat=args.repeat)
        # The fixed costs too, so one run prints every goal of docs/performance.md.
        bench_small_steps(root, SMALL_STEPS)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
