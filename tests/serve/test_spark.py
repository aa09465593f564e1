"""Spark reads the lake as it is: the manifest-listed Parquet files with Hive partitions.

One local[1] Spark session for the module (no UI, 512 MB driver), stopped with its JVM at the
end. It computes `step_stats.reward_mean` and `drift_steps.mean_abs_lp_diff_tm` from the
base tables, by the definitions in sql/sample_stats.sql, sql/step_stats.sql and
sql/drift_tokens.sql, and must get DuckDB's values. Sums run in another order in each engine,
so means agree to 1e-12 relative, not bit for bit.
"""

from __future__ import annotations

import shutil

import duckdb
import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from tests.conftest import store_of
from tokenlake import schema
from tokenlake.generator import synth
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.store import manifest

pytestmark = pytest.mark.slow

RUNS = ("example", "nonfinite")  # synth presets; `nonfinite` has NaN/inf log-probs to filter
# The partition columns' types as the catalog gives them (pipeline/tokenlake/schema.py owns them).
PINNED = {schema.RUN: T.StringType(), schema.ROLLOUT_ID: T.LongType()}


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    root = tmp_path_factory.mktemp("spark")
    for run in RUNS:
        synth.write_dump(root / run, synth.PRESETS[run])
        extract_run(root / run, store_of(root / "lake"), ExtractOptions(run_name=run, workers=1))
    # A file no manifest lists (as a crashed extraction leaves): reading the folders would
    # count its rows twice, reading the listed files does not.
    listed = (
        root
        / "lake"
        / manifest.load_manifest(store_of(root / "lake"), "example").files("tokens")[0]
    )
    shutil.copy(listed, listed.with_name("train-00000000.parquet"))
    return root / "lake"


@pytest.fixture(scope="module")
def spark():
    session = (
        SparkSession.builder.master("local[1]")
        .appName("tokenlake-test")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    gateway = SparkContext._gateway
    yield session
    session.stop()
    gateway.shutdown()  # the JVM would otherwise live until pytest exits
    gateway.proc.kill()
    gateway.proc.wait(timeout=30)
    SparkContext._gateway = SparkContext._jvm = None


def _listed(lake, table):
    """Absolute paths of the table's files that the run manifests list."""
    records = [manifest.load_manifest(store_of(lake), run) for run in RUNS]
    return [str(lake / name) for record in records for name in record.files(table)]


def read(spark, lake, table, pinned=True):
    """The table as Spark reads it: listed files, partitions from the paths under `basePath`."""
    reader = spark.read.option("basePath", str(lake / table))
    if pinned:  # a schema naming the partition columns fixes their types; no inference
        fields = [T.StructField(k, v) for k, v in PINNED.items()]
        files = spark.read.parquet(_listed(lake, table)[0]).schema.fields
        reader = reader.schema(T.StructType([*files, *fields]))
    return reader.parquet(*_listed(lake, table))


def _duckdb(lake, sql):
    con = duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_spark_infers_partition_types_and_a_schema_pins_them(spark, lake):
    inferred = read(spark, lake, schema.TOKENS, pinned=False).schema
    assert (inferred[schema.RUN].dataType, inferred[schema.ROLLOUT_ID].dataType) == (
        T.StringType(),
        T.IntegerType(),  # inferred from the values: a run of steps past 2^31 would be BIGINT
    )
    pinned = read(spark, lake, schema.TOKENS).schema
    assert [pinned[c].dataType for c in PINNED] == list(PINNED.values())
    assert pinned.names[: len(schema.TOKENS_SCHEMA)] == schema.TOKENS_SCHEMA.names


def test_spark_reads_the_rows_duckdb_reads(spark, lake):
    for table in (schema.TOKENS, schema.SAMPLES):
        counts = read(spark, lake, table).groupBy(schema.RUN).count().collect()
        expected = _duckdb(lake, f"SELECT run, COUNT(*) FROM {table} GROUP BY run")
        assert sorted(map(tuple, counts)) == sorted(expected)


def test_reward_mean_equals_step_stats(spark, lake):
    samples = read(spark, lake, schema.SAMPLES)
    rows = (
        samples.where(~F.col(schema.EVALUATION))
        .groupBy(schema.RUN, schema.ROLLOUT_ID)
        .agg(F.avg("raw_reward").alias("reward_mean"))
        .collect()
    )
    expected = _duckdb(lake, "SELECT run, rollout_id, reward_mean FROM step_stats")
    assert len(expected) == 5  # 3 steps of `example`, 2 of `nonfinite`
    got = {(r.run, r.rollout_id): r.reward_mean for r in rows}
    assert got == {(run, step): pytest.approx(mean, rel=1e-12) for run, step, mean in expected}


def _finite(column):
    return F.col(column).isNotNull() & ~F.isnan(column) & (F.abs(column) != float("inf"))


def test_mean_abs_lp_diff_equals_drift_steps(spark, lake):
    tokens = read(spark, lake, schema.TOKENS)
    covered = tokens.where(
        ~F.col(schema.EVALUATION)
        & (F.col(schema.LOSS_MASK) > 0)
        & _finite(schema.LP_DIFF)
        & _finite("train_log_prob")
        & _finite("rollout_log_prob")
    )
    delta = F.abs(F.col(schema.LP_DIFF).cast("double"))
    rows = covered.groupBy(schema.RUN, schema.ROLLOUT_ID).agg(F.avg(delta).alias("m")).collect()
    expected = _duckdb(
        lake,
        "SELECT run, rollout_id, mean_abs_lp_diff_tm, nonfinite_tokens FROM drift_steps",
    )
    assert sum(row[3] for row in expected) > 0  # the filter has NaN/inf tokens to leave out
    got = {(r.run, r.rollout_id): r.m for r in rows}
    assert got == {(run, step): pytest.approx(m, rel=1e-12) for run, step, m, _ in expected}
