"""`--executor ray` on a local multi-node Ray cluster writes the lake one process writes.

One cluster per module (a head that runs no task, two one-CPU worker nodes, small object
stores): started once, shut down at the end. A killed worker node is `remove_node`, which
kills its raylet and its worker processes mid-task.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from tests.conftest import store_of
from tests.s3server import list_keys, moto_server, new_bucket
from tokenlake import schema
from tokenlake.cli import main
from tokenlake.generator import synth
from tokenlake.orchestrate import ray_executor
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.orchestrate.progress import Reporter
from tokenlake.orchestrate.verify import verify_lake
from tokenlake.serve import catalog
from tokenlake.store import manifest

OBJECT_STORE = 80 * 2**20  # bytes per node; outcomes are a few kB, Ray's floor is ~75 MB
NODE = {"num_cpus": 1, "object_store_memory": OBJECT_STORE}
# Six training steps and one eval file: a killed node always has a step in flight.
SPEC = replace(synth.PRESETS["example"], steps=6)
STEPS = SPEC.steps + len(SPEC.eval_steps)


@pytest.fixture(scope="module")
def s3():
    """An S3 server (moto) whose endpoint and credentials are in the environment before the
    cluster starts: its nodes' workers inherit them, as on a real cluster."""
    with moto_server() as env:
        yield env


@pytest.fixture(scope="module")
def cluster(s3):
    from ray.cluster_utils import Cluster  # imported by the tests that run one, not at collection

    head = {"num_cpus": 0, "object_store_memory": OBJECT_STORE}  # tasks run on workers only
    ray_cluster = Cluster(initialize_head=True, head_node_args=head)
    for _ in range(2):
        ray_cluster.add_node(**NODE)
    ray_cluster.wait_for_nodes()
    yield ray_cluster
    ray_cluster.shutdown()


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    path = tmp_path_factory.mktemp("ray") / "dump"
    synth.write_dump(path, SPEC)
    return path


@pytest.fixture(scope="module")
def serial(dump, tmp_path_factory):
    lake = tmp_path_factory.mktemp("serial") / "lake"
    extract_run(dump, store_of(lake), ExtractOptions(run_name="ex", workers=1))
    return lake


def _rows(lake):
    """Every table's rows, sorted; `runs` without its extraction time."""
    con = duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True)
    rows = {}
    for table in schema.TABLES:
        exclude = " EXCLUDE (extracted_at)" if table == schema.RUNS else ""
        rows[table] = sorted(map(repr, con.execute(f"SELECT *{exclude} FROM {table}").fetchall()))
    con.close()
    return rows


def _steps(lake):
    """The manifest's step records without their file names (fresh per extraction)."""
    record = manifest.load_manifest(store_of(lake), "ex")
    return {label: replace(step, files={}) for label, step in record.steps.items()}


@pytest.mark.slow
def test_cli_on_a_cluster_writes_what_one_process_writes(cluster, dump, serial, tmp_path):
    lake = tmp_path / "lake"
    args = ["extract", str(dump), "--lake", str(lake), "--run-name", "ex", "--silent"]
    result = CliRunner().invoke(
        main, [*args, "--executor", "ray", "--ray-address", cluster.address]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(
        f"Run `ex`: {STEPS} new, 0 updated, 0 unchanged, 0 removed, 0 skipped steps;"
    )
    assert _rows(lake) == _rows(serial)
    assert all(_rows(lake)[t] for t in (schema.TOKENS, schema.SAMPLES, schema.RUNS))
    assert _steps(lake) == _steps(serial)  # same sources, counts and token checksums


@pytest.mark.slow
def test_tasks_write_an_object_store_lake_the_driver_commits(cluster, dump, serial):
    bucket = new_bucket()
    url = f"s3://{bucket}/lake"
    summary = extract_run(
        dump,
        store_of(url),
        ExtractOptions(run_name="ex", executor="ray", ray_address=cluster.address),
    )
    assert summary.counts["new"] == STEPS and summary.failed == []
    con = catalog.connect(store_of(url))
    try:
        remote = {
            t: sorted(map(repr, con.execute(f"SELECT * FROM {t}").fetchall()))
            for t in (schema.TOKENS, schema.SAMPLES, schema.VOCAB)
        }
    finally:
        con.close()
    local = _rows(serial)
    assert remote == {t: local[t] for t in remote}
    assert _steps(url) == _steps(serial)
    assert verify_lake(store_of(url)) == (STEPS, [])
    assert "lake/_manifest/.tokenlake.lock" not in list_keys(bucket)


def _extracting_on(node):
    """Whether a worker process of the node (a child of its raylet) is running a step now."""
    raylet = node.all_processes["raylet"][0].process.pid
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            title = (proc / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):  # the process ended meanwhile
            continue
        if parent == raylet and title.startswith(b"ray::extract_step"):
            return True
    return False


class _KillOnFirstCommit(Reporter):
    """Once the first step is committed, removes a worker node while it extracts a step."""

    def __init__(self, cluster, node):
        self.cluster, self.node, self.killed, self.busy = cluster, node, False, False

    def done(self, result):
        if self.killed:
            return
        deadline = time.monotonic() + 30
        while not self.busy and time.monotonic() < deadline:
            self.busy = _extracting_on(self.node)
            time.sleep(0.01)
        self.killed = True
        self.cluster.remove_node(self.node)


@pytest.mark.slow
def test_a_node_killed_mid_run_leaves_a_consistent_lake_and_a_rerun_completes_it(
    cluster, dump, serial, tmp_path, monkeypatch
):
    monkeypatch.setattr(ray_executor, "MAX_RETRIES", 0)  # a killed task fails its step at once
    # Ray decides where tasks run: on a loaded machine the new node may get no step before
    # the others finish them all. Such an attempt proves nothing, so it is made again.
    for attempt in range(3):
        victim = cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        lake = tmp_path / f"lake{attempt}"
        reporter = _KillOnFirstCommit(cluster, victim)
        first = extract_run(
            dump,
            store_of(lake),
            ExtractOptions(run_name="ex", executor="ray", ray_address=cluster.address),
            progress=reporter,
        )
        if reporter.busy:
            break
    assert reporter.busy  # a step was in flight on the node when it died
    assert first.failed
    for label, message in first.failed:
        step = next(s for s in synth_steps(dump) if s.label == label)
        assert message == ray_executor.task_died_text(step, 0)
    assert first.counts["new"] + first.counts["skipped"] == STEPS
    checked, problems = verify_lake(store_of(lake))
    assert (checked, problems) == (first.counts["new"], [])
    second = extract_run(
        dump,
        store_of(lake),
        ExtractOptions(run_name="ex", executor="ray", ray_address=cluster.address),
    )
    assert second.failed == []
    assert (second.counts["new"], second.counts["unchanged"]) == (len(first.failed), checked)
    assert verify_lake(store_of(lake)) == (STEPS, [])
    assert _rows(lake) == _rows(serial)


@pytest.mark.slow
def test_a_task_whose_node_dies_is_retried_elsewhere(cluster, dump, serial, tmp_path):
    victim = cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    lake = tmp_path / "lake"
    reporter = _KillOnFirstCommit(cluster, victim)
    summary = extract_run(
        dump,
        store_of(lake),
        ExtractOptions(run_name="ex", executor="ray", ray_address=cluster.address),
        progress=reporter,
    )
    assert reporter.busy  # a step was in flight on the node when it died
    assert (summary.counts["new"], summary.failed) == (STEPS, [])
    assert verify_lake(store_of(lake)) == (STEPS, [])
    assert _rows(lake) == _rows(serial)


def synth_steps(dump):
    from tokenlake.read.dump import discover

    return discover(dump).steps


def test_without_ray_the_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    result = CliRunner().invoke(
        main,
        ["extract", str(tmp_path / "none"), "--lake", str(tmp_path / "lake"), "--executor", "ray"],
    )
    assert (result.exit_code, result.stderr) == (
        1,
        "Error: Extraction with `--executor ray` needs `ray`, which is not installed: run"
        " `pip install 'tokenlake[ray]'` (`make setup-test` installs it).\n",
    )
    assert not (tmp_path / "lake").exists()  # refused before any work


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--ray-address", "auto"], "--ray-address needs --executor ray."),
        (["--executor", "ray", "--follow"], "--executor ray cannot be combined with --follow yet."),
    ],
)
def test_ray_options_misused(tmp_path, options, message):
    result = CliRunner().invoke(main, ["extract", str(tmp_path), *options])
    assert (result.exit_code, result.stderr) == (1, f"Error: {message}\n")


def test_importing_tokenlake_does_not_import_ray():
    code = "import sys, tokenlake.cli, tokenlake.orchestrate.extract, tokenlake.orchestrate.ray_executor; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "False\n"
