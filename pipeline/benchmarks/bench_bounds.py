"""`make bench-bounds`: what refusing each file kind of docs/security.md's table of bounds costs.

For every row of that table ("Size bounds for every file read"), a hostile file is built just
beyond its bound (the bound read from tokenlake's own constants, so the file follows it) and
planted in a small generated dump or lake; the command a user runs on it (`extract`, `verify`,
`extract --meta`) then runs in a process of its own, once on the clean input and once on the
hostile one. Printed per kind: the hostile run's wall time and peak memory (RSS, from the
child's rusage), the clean run's beside it, and the line of the refusal, which must be printed
(a run that does not refuse is a failure, never a figure). Files over a size bound are sparse
(their holes take no disk); line bounds need real bytes, so those files are the bound plus one
byte. The two object-store kinds run against moto's S3 server on 127.0.0.1 (the `moto` and
`s3` extras, `make setup-test`); without them they are printed as not measured.

Usage: python -m benchmarks.bench_bounds [--only KIND ...] [--work DIR] [--hostile-only]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from tokenlake import Lake, tags
from tokenlake.read import dashboard, nemo_rl, prime_rl, trajectory, vocab
from tokenlake.read.remote import remote_stage
from tokenlake.serve import user_views
from tokenlake.store import manifest, object_lock, parquet

MB = 1_000_000


@dataclass(frozen=True)
class Measured:
    seconds: float
    peak_rss: int  # bytes
    code: int
    output: str


@dataclass(frozen=True)
class Case:
    """One row of the table: `kind` is its first cell as docs/security.md writes it."""

    kind: str
    preset: str  # the generated dump it starts from
    plant: Callable[[Path, Path, bool], list[str]]  # (dump, lake, hostile) -> command
    refusal: str  # text of the refusal line, printed only by the hostile run
    # For a refusal that prints nothing: after the hostile run, what shows it happened (None:
    # it did not).
    check: Callable[[Path, Path], str | None] | None = None
    prepare: str = ""  # "extract": the lake is extracted before both runs
    remote: bool = False  # needs the S3 server


def run_measured(argv: list[str], env: dict[str, str] | None = None) -> Measured:
    """`tokenlake ARGV` in a child process: its wall time and its peak RSS (rusage)."""
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "tokenlake", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    assert child.stdout is not None
    output = child.stdout.read().decode("utf-8", "replace")
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    return Measured(seconds, usage.ru_maxrss * 1024, child.returncode, output)


def sparse(path: Path, size: int, start: bytes = b"") -> None:
    """A file of `size` bytes holding `start`, the rest a hole (no disk)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(start)
    os.truncate(path, size)


def line_file(path: Path, length: int, fill: bytes = b" ") -> None:
    """A file holding one line of `length` bytes (real bytes: a line bound reads them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    chunk = fill * (1 << 20)
    with path.open("wb") as out:
        left = length
        while left > 0:
            out.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
        out.write(b"\n")


def _extract(dump: Path, lake: Path | str, *extra: str) -> list[str]:
    return ["extract", str(dump), "--lake", str(lake), "--workers", "1", "--silent", *extra]


def _last_rollout(dump: Path) -> Path:
    return max((dump / "rollout_data").glob("[0-9]*.pt"), key=lambda p: int(p.stem))


def _laughs_pickle(levels: int, width: int) -> bytes:
    """Protocol-2 opcodes of nested lists that share one list `width` times a level: a few
    hundred bytes that would unpickle into width**levels references."""
    ops = bytearray(b"\x80\x02]q\x00(K\x00e")  # memo 0: [0]
    for level in range(1, levels + 1):
        ops += b"]q" + bytes([level]) + b"(" + (b"h" + bytes([level - 1])) * width + b"e"
    return bytes(ops + b".")


def plant_pt(dump: Path, lake: Path, hostile: bool) -> list[str]:
    if hostile:
        target = _last_rollout(dump)
        with zipfile.ZipFile(target, "w") as archive:
            archive.writestr("archive/data.pkl", _laughs_pickle(levels=9, width=10))
            archive.writestr("archive/byteorder", "little")
            archive.writestr("archive/version", "3\n")
    return _extract(dump, lake)


def plant_trajectory(dump: Path, lake: Path, hostile: bool) -> list[str]:
    if hostile:
        sparse(dump / "trajectory" / "0.jsonl", trajectory.MAX_FILE_BYTES + 1)
    return _extract(dump, lake)


def plant_tokenizer(dump: Path, lake: Path, hostile: bool) -> list[str]:
    target = dump / "tokenizer" / "tokenizer.json"
    if hostile:
        sparse(target, vocab.MAX_TOKENIZER_BYTES + 1)
    return _extract(dump, lake)


def plant_meta(dump: Path, lake: Path, hostile: bool) -> list[str]:
    target = dump / "dashboard" / dashboard.META_FILE
    if hostile:
        sparse(target, dashboard.MAX_META_BYTES + 1, b"{")
    return _extract(dump, lake)


def plant_metrics(dump: Path, lake: Path, hostile: bool) -> list[str]:
    if hostile:  # one line without a newline, past the line bound
        line_file(dump / "dashboard" / "metrics.jsonl", dashboard.MAX_LINE_BYTES + 1)
    return _extract(dump, lake)


def plant_manifest(dump: Path, lake: Path, hostile: bool) -> list[str]:
    if hostile:
        sparse(lake / "_manifest" / "other.json", manifest.MAX_MANIFEST_BYTES + 1)
    return ["verify", str(lake)]


def plant_meta_option(dump: Path, lake: Path, hostile: bool) -> list[str]:
    meta = dump.parent / "run-meta.json"
    if hostile:
        sparse(meta, tags.MAX_META_FILE_BYTES + 1, b"{")
    else:
        meta.write_text('{"precision": "bf16"}')
    return _extract(dump, lake, "--meta", str(meta))


def plant_prime_rl_line(dump: Path, lake: Path, hostile: bool) -> list[str]:
    if hostile:
        steps = sorted((dump / "token_exports").glob("step_*"), key=lambda p: int(p.name[5:]))
        line_file(steps[-1] / "rank_0.jsonl", prime_rl.MAX_LINE_BYTES + 1)
    return _extract(dump, lake)


def plant_prime_rl_metrics(dump: Path, lake: Path, hostile: bool) -> list[str]:
    if hostile:
        with (dump / "metrics.jsonl").open("ab") as out:
            out.write(b" " * (dashboard.MAX_LINE_BYTES + 1) + b"\n")
    return _extract(dump, lake)


def plant_nemo_rl_line(dump: Path, lake: Path, hostile: bool) -> list[str]:
    if hostile:
        last = max(dump.glob("train_data_step*.jsonl"), key=lambda p: int(p.stem[15:]))
        line_file(last, nemo_rl.MAX_LINE_BYTES + 1)
    return _extract(dump, lake)


def _rewrite_first_sample(dump: Path, change: Callable[[dict[str, object]], None]) -> None:
    """Change the first sample of the dump's last rollout file (the generator's own file,
    loaded as plain tensors and lists)."""
    import torch

    target = _last_rollout(dump)
    payload = torch.load(target, weights_only=True)
    change(payload["samples"][0])
    torch.save(payload, target)


def plant_weight_versions(dump: Path, lake: Path, hostile: bool) -> list[str]:
    if hostile:

        def long_versions(sample: dict[str, object]) -> None:  # 1 MiB a version string
            sample["weight_versions"] = ["v" * (1 << 20)]

        _rewrite_first_sample(dump, long_versions)
    return _extract(dump, lake)


def plant_experts(dump: Path, lake: Path, hostile: bool) -> list[str]:
    if hostile:
        import numpy as np

        def empty_experts(sample: dict[str, object]) -> None:
            sample["rollout_routed_experts"] = np.lib.stride_tricks.as_strided(
                np.zeros(1, np.int32), (1_000_000_000, 0, 8), (0, 0, 0)
            )

        _rewrite_first_sample(dump, empty_experts)
    return _extract(dump, lake, "--with-experts")


def plant_lake_parquet(dump: Path, lake: Path, hostile: bool) -> list[str]:
    """A step's tokens file whose `token_version` is one dictionary string just long enough
    that the file decodes past its bound, taken by every row."""
    if hostile:
        import pyarrow as pa
        import pyarrow.parquet as pq

        target = next((lake / "tokens").glob("run=*/rollout_id=1/train-*.parquet"))
        table = pq.read_table(target)
        index = table.schema.get_field_index("token_version")
        size = target.stat().st_size
        while True:  # the bound grows with the file: until the written file is past its own
            length = parquet.decoded_bound(size) // max(table.num_rows, 1) + 1
            strings = pa.array(["v" * length] * table.num_rows, pa.string())
            forged = table.set_column(index, table.schema.field(index), strings)
            pq.write_table(forged, target, compression="zstd", use_dictionary=True)
            if target.stat().st_size <= size:
                break
            size = target.stat().st_size
    return ["verify", str(lake)]


def plant_user_view(dump: Path, lake: Path, hostile: bool) -> list[str]:
    if hostile:
        sparse(
            lake / "views" / "big.sql", user_views.MAX_USER_VIEW_BYTES + 1, b"CREATE VIEW big AS"
        )
    return ["views", str(lake)]


def plant_lock(dump: Path, lake: Path, hostile: bool) -> list[str]:
    url = _bucket_lake(lake)
    if hostile:
        import boto3

        bucket, key = url.removeprefix("s3://").split("/", 1)
        body = b" " * (object_lock.MAX_LOCK_BYTES + 1)
        boto3.client("s3").put_object(
            Bucket=bucket, Key=f"{key}/_manifest/.tokenlake.lock", Body=body
        )
    return _extract(dump, url)


def plant_stage_state(dump: Path, lake: Path, hostile: bool) -> list[str]:
    url = _bucket_dump(dump)
    if hostile:
        for state in (dump.parent / "cache").glob(f"dumps/*/*/{remote_stage.STATE_FILE}"):
            sparse(state, remote_stage.MAX_STATE_BYTES + 1)
    return ["extract", url, "--lake", str(lake), "--workers", "1", "--silent"]


def _stage_written_again(dump: Path, lake: Path) -> str | None:
    """The state file, treated as absent, was written again by staging the dump anew."""
    states = list((dump.parent / "cache").glob(f"dumps/*/*/{remote_stage.STATE_FILE}"))
    sizes = [state.stat().st_size for state in states]
    if not sizes or max(sizes) > remote_stage.MAX_STATE_BYTES:
        return None
    return f"(nothing printed) the stage was downloaded again: its state is {max(sizes):,} bytes"


def _bucket_lake(lake: Path) -> str:
    return (lake.parent / "lake-url").read_text()


def _bucket_dump(dump: Path) -> str:
    return (dump.parent / "dump-url").read_text()


CASES = [
    Case("`rollout_data/*.pt`, `train_data/*.pt`", "example", plant_pt, "Skipped step 2"),
    Case(
        "`trajectory/{step}.jsonl`",
        "example",
        plant_trajectory,
        "a trajectory file may be at most 1 GiB",
    ),
    Case(
        "`tokenizer/tokenizer.json`",
        "example",
        plant_tokenizer,
        "a `tokenizer.json` may be at most 64 MiB",
    ),
    Case(
        "`dashboard/meta.json`",
        "example",
        plant_meta,
        "a dashboard `meta.json` may be at most 1 MiB",
    ),
    Case(
        "`dashboard/metrics.jsonl`, `dashboard/metrics/*.jsonl`",
        "example",
        plant_metrics,
        "longer than 1048576 bytes; line skipped",
    ),
    Case(
        "`_manifest/<run>.json` (local or object store)",
        "example",
        plant_manifest,
        "a run manifest may be at most 64 MiB",
        prepare="extract",
    ),
    Case(
        "`--meta FILE` (JSON or YAML)", "example", plant_meta_option, "is larger than 1048576 bytes"
    ),
    Case(
        "`views/*.sql` (user views, [above](#user-views))",
        "example",
        plant_user_view,
        "it is larger than 65536 bytes",
        prepare="extract",
    ),
    Case(
        "an object-store lake's writer lock `_manifest/.tokenlake.lock`",
        "example",
        plant_lock,
        "took over the stale writer lock",
        prepare="extract",
        remote=True,
    ),
    Case(
        "the remote stage's `.tokenlake-remote.json`",
        "example",
        plant_stage_state,
        "",
        prepare="extract",
        remote=True,
        check=_stage_written_again,
    ),
    Case(
        "prime-rl's `token_exports/step_{N}/rank_{R}.jsonl`",
        "prime-rl",
        plant_prime_rl_line,
        "is longer than 256 MiB",
    ),
    Case("prime-rl's `metrics.jsonl`", "prime-rl", plant_prime_rl_metrics, "line skipped"),
    Case(
        "NeMo-RL's `train_data_step{N}.jsonl`, `val_data_step{N}.jsonl`",
        "nemo-rl",
        plant_nemo_rl_line,
        "is longer than 256 MiB",
    ),
    Case(
        "`Sample.weight_versions` (a version repeated on every response token it covers, `token_version`)",
        "example",
        plant_weight_versions,
        "`token_version` holds at most 256 bytes a token",
    ),
    Case(
        "`rollout_routed_experts`, `rollout_indexer_topk` (`--with-experts`)",
        "example",
        plant_experts,
        "hold no values",
    ),
    Case(
        "the lake's own Parquet files: `tokens`, `samples`, `experts`, every rollup, `runs`,"
        " `vocab`, `metrics` (`store/parquet.read_table`, the one reader in Python)",
        "example",
        plant_lake_parquet,
        "more than the",
        prepare="extract",
    ),
]


@contextlib.contextmanager
def s3_server() -> Iterator[bool]:
    """moto's S3 server for the object-store kinds; False when its extras are missing."""
    try:
        from benchmarks import s3server
    except ImportError:
        yield False
        return
    try:
        import boto3  # noqa: F401
        import moto  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError:
        yield False
        return
    with s3server.moto_server():
        yield True


def _generated(work: Path, preset: str) -> Path:
    target = work / "presets" / preset
    if not target.exists():
        done = subprocess.run(
            [sys.executable, "-m", "tokenlake", "generate", str(target), "--preset", preset],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"bench-bounds: generating `{preset}` failed: {done.stderr.strip()}")
    return target


def _set_up(case: Case, work: Path, run: str) -> tuple[Path, Path]:
    """A fresh copy of the case's dump and a lake for it (extracted when the case says)."""
    root = work / "cases" / f"{re.sub(r'[^a-z0-9]+', '-', case.kind.lower()).strip('-')[:40]}-{run}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    dump, lake = root / "dump", root / "lake"
    shutil.copytree(_generated(work, case.preset), dump)
    if case.remote:
        _upload(case, root, dump)
    if case.prepare == "extract":
        if case.plant is plant_lock:
            argv = _extract(dump, _bucket_lake(lake))
        elif case.plant is plant_stage_state:
            argv = ["extract", _bucket_dump(dump), "--lake", str(lake), "--silent"]
        else:
            argv = _extract(dump, lake)
        done = run_measured(argv, _env(dump))
        if done.code != 0:
            raise SystemExit(f"bench-bounds: preparing `{case.kind}` failed:\n{done.output}")
    return dump, lake


def _upload(case: Case, root: Path, dump: Path) -> None:
    import boto3

    from benchmarks import s3server

    bucket = s3server.new_bucket("bounds")
    (root / "lake-url").write_text(f"s3://{bucket}/lake")
    (root / "dump-url").write_text(f"s3://{bucket}/dump")
    if case.plant is plant_stage_state:
        client = boto3.client("s3")
        for path in sorted(dump.rglob("*")):
            if path.is_file():
                key = f"dump/{path.relative_to(dump).as_posix()}"
                client.upload_file(str(path), bucket, key)


def _env(dump: Path) -> dict[str, str]:
    """The commands' environment: a cache of the case's own (a remote dump's stage)."""
    return {**os.environ, "TOKENLAKE_CACHE": str(dump.parent / "cache")}


def measure(case: Case, work: Path, clean_too: bool = True) -> tuple[Measured | None, Measured]:
    """The case's command on clean input (unless not `clean_too`), then on the hostile file."""
    clean = None
    if clean_too:
        dump, lake = _set_up(case, work, "clean")
        clean = run_measured(case.plant(dump, lake, False), _env(dump))
    dump, lake = _set_up(case, work, "hostile")
    hostile = run_measured(case.plant(dump, lake, True), _env(dump))
    if clean is not None and case.refusal and case.refusal in clean.output:
        raise SystemExit(f"bench-bounds: `{case.kind}`: the clean run printed the refusal")
    shown = case.check(dump, lake) if case.check is not None else None
    if case.check is not None and shown is None:
        raise SystemExit(f"bench-bounds: `{case.kind}`: the hostile run did not refuse it")
    if case.check is not None:
        hostile = replace(hostile, output=f"{shown}\n{hostile.output}")
    elif case.refusal not in hostile.output:
        raise SystemExit(
            f"bench-bounds: `{case.kind}`: the hostile run did not refuse it (exit"
            f" {hostile.code}):\n{hostile.output}"
        )
    return clean, hostile


def refusal_line(case: Case, output: str) -> str:
    """The printed line that holds the case's refusal (the first line, without one)."""
    lines = output.strip().splitlines() or [""]
    found = [line for line in lines if case.refusal and case.refusal in line]
    return (found or lines)[0]


def figure(measured: Measured) -> str:
    """A run as the table's column states it.

    Examples:
        >>> figure(Measured(1.234, 187_000_000, 0, ""))
        '1.2 s, 187 MB'
    """
    return f"{measured.seconds:.1f} s, {measured.peak_rss / MB:,.0f} MB"


def identity_costs(work: Path, steps: int) -> list[str]:
    """What readers' identity checks cost on a lake of `steps` small steps (4 samples, DP 2):
    every listed file's footer read and compared, the whole choice of what is served (links
    included), against a whole `query SELECT 1`. Best of 3 each."""
    from tokenlake.generator import synth
    from tokenlake.serve.served import served_records

    dump, lake = work / "identities" / "dump", work / "identities" / "lake"
    shutil.rmtree(dump.parent, ignore_errors=True)
    spec = synth.DumpSpec(
        steps=steps, prompts_per_step=2, samples_per_prompt=2, dp=2, eval_steps=()
    )
    synth.write_dump(dump, spec)
    env = {**os.environ, "TOKENLAKE_CACHE": str(work / "identities" / "cache")}
    done = run_measured(_extract(dump, lake), env)
    if done.code != 0:
        raise SystemExit(f"bench-bounds: extracting {steps} steps failed:\n{done.output}")
    store = Lake(lake).store
    records = manifest.load_all(store)
    listed = [
        (name, recorded)
        for record in records
        for step in record.steps.values()
        for table, name in step.files.items()
        if (recorded := step.identities.get(table)) is not None
    ] + [(name, record.side_identities[name]) for record in records for name in record.side_files()]

    def footers() -> None:
        changed = [
            name for name, recorded in listed if parquet.footer_identity(store, name) != recorded
        ]
        assert changed == [], changed

    footer_seconds = min(_timed(footers) for _ in range(3))
    served_seconds = min(_timed(lambda: served_records(store, records)) for _ in range(3))
    query = min(run_measured(["query", str(lake), "SELECT 1"], env).seconds for _ in range(3))
    return [
        f"identity checks of a reader, a lake of {steps} steps ({len(listed):,} files):",
        f"  every footer read and compared: {footer_seconds * 1000:.1f} ms"
        f" ({footer_seconds / len(listed) * 1e6:.0f} us a file); the whole choice of what is"
        f' served: {served_seconds * 1000:.1f} ms; `tokenlake query LAKE "SELECT 1"`: {query:.2f} s',
    ]


def _timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_bounds")
    parser.add_argument("--only", action="append", default=[], help="a kind (a part of its name)")
    parser.add_argument("--work", type=Path, help="where the dumps go (default: a temp dir)")
    parser.add_argument(
        "--hostile-only", action="store_true", help="skip the runs on clean input (a quick check)"
    )
    parser.add_argument(
        "--identity-steps", type=int, default=100, help="steps of the identity-check lake (0: none)"
    )
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.only or any(o in c.kind for o in args.only)]
    if not cases:
        parser.error(f"no kind matches {args.only}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        has_s3 = stack.enter_context(s3_server()) if any(c.remote for c in cases) else False
        for case in cases:
            if case.remote and not has_s3:
                print(f"{case.kind}\n  not measured: needs moto and s3fs (make setup-test)")
                continue
            clean, hostile = measure(case, work, not args.hostile_only)
            beside = "" if clean is None else f" (clean: {figure(clean)})"
            print(f"{case.kind}\n  refused: {figure(hostile)}{beside}")
            print(f"  {refusal_line(case, hostile.output)}")
        if args.identity_steps > 0:
            print("\n".join(identity_costs(work, args.identity_steps)))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
