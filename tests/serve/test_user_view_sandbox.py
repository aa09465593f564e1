"""A user view (`LAKE/views/*.sql`) is a view over the lake and nothing else.

Each attack a writer of a shared lake could put in `views/` is crafted here: DuckDB's nested
block comments hiding a COPY, ATTACH, a macro shadowing `abs`, INSTALL from a URL, a
well-formed view reading the reader's files or settings, names of built-ins, odd files. Each
is refused with one warning line naming the file and the reason, nothing it asked for
happens, and the rest of the catalog (good user views included) is built. On an object-store
lake the same holds for a reader that only queries.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from tests.conftest import store_of
from tests.lakes import add_rollups, write_rows
from tokenlake import layout, schema
from tokenlake.cli import main
from tokenlake.serve import catalog, user_views
from tokenlake.serve.user_view_check import Refused, catalog_objects, create_checked, open_sandbox

TOKENLAKE_MACROS = {
    "clamp_abs",
    "clamp_to",
    "drift_breakdown",
    "drift_counts",
    "drift_covered",
    "drift_finite",
    "drift_means",
    "drift_parts",
    "drift_rollup",
    "drift_statistics",
    "drift_sums",
    "drift_terms",
    "drift_totals",
    "ess_fraction",
    "histogram_half_widths",
    "incomplete_steps",  # the steps the manifests mark incomplete
    "large_lp_diff_floor",
    "outliers_kept",
    "k3_term",
    "log2_bucket",
    "outlier_rows",  # an outlier row's typed columns (a table macro)
    "sample_drift",
    "step_reward",
    "step_share",
    "with_sample_properties",  # training rows joined with their sample (a table macro)
    "tokenlake_listed_digest",  # the catalog's record of the files it lists
}
RUNS = [{"run": "r", "source_dir": "/d", "tool": "t"}]
TOKENS = [
    {"run": "r", "rollout_id": 0, "evaluation": False, "batch_position": 0, "position": p,
     "loss_mask": 1.0, "lp_diff": d, "train_log_prob": -1.0, "rollout_log_prob": -1.0 - d}
    for p, d in enumerate([-0.5, 0.25, -0.125])
]  # fmt: skip
FORM = "it must hold one `CREATE OR REPLACE VIEW {} AS ...` and nothing else"


def lake_with_views(tmp_path: Path, files: dict[str, str]) -> Path:
    lake = tmp_path / "lake"
    folder = lake / "views"
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    write_rows(lake, schema.TOKENS, TOKENS)
    write_rows(lake, schema.RUNS, RUNS)
    add_rollups(lake)
    return lake  # the test builds the catalog


def build(lake: Path) -> list[str]:
    warnings: list[str] = []
    catalog.build_catalog(store_of(lake), warnings)
    return warnings


def skipped(lake: Path, name: str, reason: str) -> str:
    return f"User view `{lake / 'views' / name}` skipped: {reason}."


def query(lake: Path, sql: str) -> list[tuple[object, ...]]:
    """Through a plain DuckDB client, as `duckdb -readonly LAKE/tokenlake.duckdb` would."""
    with duckdb.connect(str(lake / layout.CATALOG_FILE), read_only=True) as con:
        return con.execute(sql).fetchall()


def user_objects(lake: Path) -> tuple[set[str], set[str], list[str]]:
    """Views (besides tokenlake's), macros, attached databases of the catalog."""
    views = {
        name for (name,) in query(lake, "SELECT view_name FROM duckdb_views() WHERE NOT internal")
    } - set(catalog.expected_views())
    macros = {
        n for (n,) in query(lake, "SELECT function_name FROM duckdb_functions() WHERE NOT internal")
    }
    databases = sorted(n for (n,) in query(lake, "SELECT database_name FROM duckdb_databases()"))
    return views, macros, databases


def test_a_copy_behind_nested_comments_writes_nothing(tmp_path: Path) -> None:
    """DuckDB nests block comments: the file is one COPY, refused before anything runs."""
    target = tmp_path / "written.csv"
    lake = lake_with_views(
        tmp_path,
        {
            "a.sql": "/* /* */ CREATE OR REPLACE VIEW a AS SELECT 1 */"
            f" COPY (SELECT 42) TO '{target}'",
            "A.sql": "CREATE VIEW A AS SELECT 1 AS one",
        },
    )
    result = CliRunner().invoke(main, ["views", str(lake)])
    assert (result.exit_code, result.stdout) == (0, f"Rebuilt {lake / layout.CATALOG_FILE}\n")
    assert result.stderr == f"Warning: {skipped(lake, 'a.sql', FORM.format('a'))}\n"
    assert not target.exists()
    assert query(lake, "SELECT one FROM A") == [(1,)]
    result = CliRunner().invoke(main, ["tag", str(lake), "r", "k=v"])  # rebuilds the catalog
    assert (result.exit_code, result.stderr) == (
        0,
        f"Warning: {skipped(lake, 'a.sql', FORM.format('a'))}\n",
    )
    assert not target.exists()


def test_attach_and_drop_on_another_database_never_run(tmp_path: Path) -> None:
    other = tmp_path / "other.duckdb"
    with duckdb.connect(str(other)) as con:
        con.execute("CREATE TABLE precious AS SELECT 7 AS x")
    lake = lake_with_views(
        tmp_path,
        {
            "b.sql": f"/* /* */ CREATE VIEW b AS SELECT 1 */ ATTACH '{other}' AS o",
            "c.sql": f"CREATE VIEW c AS SELECT 1; ATTACH '{other}' AS o; DROP TABLE o.precious",
        },
    )
    assert build(lake) == [
        skipped(lake, "b.sql", FORM.format("b")),
        skipped(lake, "c.sql", FORM.format("c")),
    ]
    with duckdb.connect(str(other), read_only=True) as con:
        assert con.execute("SELECT x FROM precious").fetchall() == [(7,)]
    assert user_objects(lake) == (set(), TOKENLAKE_MACROS, ["system", "temp", "tokenlake"])


def test_a_macro_cannot_shadow_abs_for_any_reader(tmp_path: Path) -> None:
    """`abs` stays DuckDB's in the catalog, for tokenlake's readers and plain clients."""
    lake = lake_with_views(
        tmp_path,
        {
            "m.sql": "/* /* */ CREATE VIEW m AS SELECT 1 */ CREATE OR REPLACE MACRO abs(x) AS x*0.0",
            "n.sql": "CREATE OR REPLACE MACRO abs(x) AS x * 0.0",
            "M.sql": "CREATE VIEW M AS SELECT 1 AS one",  # the view the file is taken for
            "abs.sql": "CREATE VIEW abs AS SELECT 1 AS x",
        },
    )
    assert build(lake) == [
        skipped(
            lake, "abs.sql", "`abs` is the name of a function or macro; give the file another name"
        ),
        skipped(lake, "m.sql", FORM.format("m")),
        skipped(lake, "n.sql", FORM.format("n")),
    ]
    assert query(lake, "SELECT abs(-2.5)") == [(2.5,)]
    con = catalog.connect(store_of(lake))
    try:
        assert con.execute("SELECT abs(-2.5)").fetchall() == [(2.5,)]
        mean = con.execute("SELECT mean_abs_lp_diff_tm FROM drift_steps").fetchall()
    finally:
        con.close()
    assert mean == [(pytest.approx(0.875 / 3),)]
    assert user_objects(lake)[:2] == ({"M"}, TOKENLAKE_MACROS)


@pytest.fixture
def http_requests() -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server; yields its URL and the paths it was asked for."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def test_install_from_a_url_and_reading_a_url_make_no_request(
    tmp_path: Path, http_requests: tuple[str, list[str]]
) -> None:
    url, asked = http_requests
    lake = lake_with_views(
        tmp_path,
        {
            "d.sql": f"/* /* */ CREATE VIEW d AS SELECT 1 */ INSTALL x FROM '{url}/'",
            "e.sql": f"CREATE VIEW e AS SELECT * FROM read_text('{url}/e')",
            "f.sql": f"CREATE VIEW f AS SELECT * FROM '{url}/f.csv'",
        },
    )
    assert build(lake) == [
        skipped(lake, "d.sql", FORM.format("d")),
        skipped(
            lake,
            "e.sql",
            "it calls table function `read_text`; a user view may read only the lake's tables"
            " and views (and generate_series, range, unnest)",
        ),
        skipped(
            lake,
            "f.sql",
            f"it reads `{url}/f.csv`, which is not a table or view of the lake nor another user"
            " view",
        ),
    ]
    assert asked == []


NOT_THE_LAKE = "which is not a table or view of the lake nor another user view"
READ_TEXT = (
    "it calls table function `read_text`; a user view may read only the lake's tables and views"
    " (and generate_series, range, unnest)"
)


# What a well-formed view may not read or call, and why it is refused.
HOSTILE_QUERIES = [
    (
        "SELECT * FROM read_text('/etc/passwd')",
        "it calls table function `read_text`; a user view may read only the lake's tables"
        " and views (and generate_series, range, unnest)",
    ),
    ("SELECT * FROM '/etc/passwd'", f"it reads `/etc/passwd`, {NOT_THE_LAKE}"),
    ("SELECT * FROM tokens, nowhere", f"it reads `nowhere`, {NOT_THE_LAKE}"),
    (
        "SELECT (SELECT count(*) FROM read_csv('/etc/passwd')) AS n",
        "it calls table function `read_csv`; a user view may read only the lake's tables"
        " and views (and generate_series, range, unnest)",
    ),
    (
        "SELECT * FROM query_table('tokens')",
        "it calls table function `query_table`; a user view may read only the lake's"
        " tables and views (and generate_series, range, unnest)",
    ),
    (
        "SELECT * FROM drift_breakdown('/etc/passwd')",
        "it calls `drift_breakdown` with an argument that is not a table or view name",
    ),
    ("SELECT * FROM drift_breakdown(secrets)", f"it reads `secrets`, {NOT_THE_LAKE}"),
    (
        'WITH "/etc/passwd" AS (SELECT 1) SELECT * FROM "/etc/passwd"',
        "its CTE `/etc/passwd` is not a plain SQL name (ASCII letters, digits and `_`, not"
        " starting with a digit, at most 64 characters)",
    ),
    (
        "SELECT current_setting('s3_secret_access_key') AS k",
        "it calls `current_setting`, which a user view may not (it reads the reader's settings)",
    ),
    (
        "SELECT getvariable('token') AS v",
        "it calls `getvariable`, which a user view may not (it reads the reader's variables)",
    ),
    (
        "SELECT * FROM system.main.duckdb_settings",
        "it names `duckdb_settings` with a schema or catalog; a user view names the lake's"
        " tables and views without one",
    ),
    ("SELECT * FROM duckdb_secrets", f"it reads `duckdb_secrets`, {NOT_THE_LAKE}"),
    (
        "SELECT list_transform([1], x -> (SELECT content FROM read_text('/etc/passwd'))) AS l",
        READ_TEXT,
    ),
    ("SELECT * FROM (VALUES (1)) AS v(x), LATERAL read_text('/etc/passwd')", READ_TEXT),
    (
        "SELECT * FROM tokens LIMIT (SELECT count(*) FROM glob('/*'))",
        "it calls table function `glob`; a user view may read only the lake's tables and views"
        " (and generate_series, range, unnest)",
    ),
    (  # a CTE is visible inside its own query only: outside, `x` could be anything
        "SELECT * FROM (WITH x AS (SELECT 1) SELECT * FROM x) AS s, x",
        f"it reads `x`, {NOT_THE_LAKE}",
    ),
    ("SELECT * FROM range(3) AS t, drift_breakdown(t)", f"it reads `t`, {NOT_THE_LAKE}"),
    ("DESCRIBE tokens", "it reads from a `SHOW_REF`, which a user view may not"),
    ("SELECT " + "abs(" * 900 + "1" + ")" * 900, "it nests too deeply to be checked"),
]


def test_a_well_formed_view_reads_only_the_lake(tmp_path: Path) -> None:
    files = {
        f"v{i:02}.sql": f"CREATE VIEW v{i:02} AS {text}"
        for i, (text, _) in enumerate(HOSTILE_QUERIES)
    }
    lake = lake_with_views(tmp_path, files)
    assert build(lake) == [
        skipped(lake, f"v{i:02}.sql", reason) for i, (_, reason) in enumerate(HOSTILE_QUERIES)
    ]
    assert user_objects(lake)[0] == set()


def test_the_sandbox_alone_stops_a_file_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second wall: with the syntax check switched off, binding on the sandbox (no file
    access) still refuses the view before the catalog sees it."""
    monkeypatch.setattr(user_views, "check_tree", lambda *args: Counter())  # it reads nothing
    lake = lake_with_views(
        tmp_path, {"v.sql": "CREATE VIEW v AS SELECT * FROM read_text('/etc/passwd')"}
    )
    assert build(lake) == [
        skipped(
            lake,
            "v.sql",
            'Permission Error: Cannot access file "/etc/passwd" - file system operations are'
            " disabled by configuration",
        )
    ]


def test_a_view_created_with_anything_else_is_rolled_back() -> None:
    """The last wall: a statement that created more than its one view leaves nothing."""
    sandbox = open_sandbox()
    try:
        before = catalog_objects(sandbox)
        with pytest.raises(Refused, match="^creating it changed more than one view$"):
            create_checked(sandbox, "v", "SELECT 1 AS x; CREATE MACRO abs(x) AS x * 0.0", before)
        assert catalog_objects(sandbox) == before
        assert sandbox.execute("SELECT abs(-2)").fetchall() == [(2,)]
        assert sandbox.execute(
            "SELECT count(*) FROM duckdb_views() WHERE view_name = 'v'"
        ).fetchall() == [(0,)]
    finally:
        sandbox.close()


def test_tokenlake_macros_shadow_no_builtin() -> None:
    """tokenlake's own macros are stored in the catalog too: none may take a built-in's name."""
    with duckdb.connect() as con:
        builtins = {
            n for (n,) in con.execute("SELECT function_name FROM duckdb_functions()").fetchall()
        }
    sandbox = open_sandbox()
    try:
        rows = sandbox.execute("SELECT function_name FROM duckdb_functions() WHERE NOT internal")
        macros = {name for (name,) in rows.fetchall()}
    finally:
        sandbox.close()
    # the sandbox lists no files and no manifest's marks
    assert macros == TOKENLAKE_MACROS - {"tokenlake_listed_digest", "incomplete_steps"}
    assert TOKENLAKE_MACROS & builtins == set()


def test_names_that_are_taken_or_odd_are_refused(tmp_path: Path) -> None:
    lake = lake_with_views(
        tmp_path,
        {
            "tokens.sql": "CREATE VIEW tokens AS SELECT 1 AS x",
            "step_stats.sql": "CREATE VIEW step_stats AS SELECT 1 AS x",
            "k3_term.sql": "CREATE VIEW k3_term AS SELECT 1 AS x",
            "duckdb_tables.sql": "CREATE VIEW duckdb_tables AS SELECT 1 AS x",
            "select.sql": 'CREATE VIEW "select" AS SELECT 1 AS x',
            "my-view.sql": 'CREATE VIEW "my-view" AS SELECT 1 AS x',
            "9lives.sql": 'CREATE VIEW "9lives" AS SELECT 1 AS x',
            "esc\x1b[2J.sql": "CREATE VIEW x AS SELECT 1 AS x",
        },
    )
    odd = (
        "its file name is not a plain SQL name (ASCII letters, digits and `_`, not starting"
        " with a digit, at most 64 characters) with `.sql`"
    )
    assert build(lake) == [
        skipped(lake, "9lives.sql", odd),
        skipped(lake, "duckdb_tables.sql", "`duckdb_tables` is a name of DuckDB's system views; give the file another name"),
        f"User view `{lake / 'views'}/esc\\x1b[2J.sql` skipped: {odd}.",
        skipped(lake, "k3_term.sql", "`k3_term` is the name of a function or macro; give the file another name"),
        skipped(lake, "my-view.sql", odd),
        skipped(lake, "select.sql", "`select` is an SQL keyword; give the file another name"),
        skipped(lake, "step_stats.sql", "`step_stats` is one of tokenlake's views; give the file another name"),
        skipped(lake, "tokens.sql", "`tokens` is one of tokenlake's views; give the file another name"),
    ]  # fmt: skip
    assert query(lake, "SELECT count(*) FROM tokens") == [(3,)]


def test_odd_files_are_refused_without_following_or_hanging(tmp_path: Path) -> None:
    secret = tmp_path / "secret.sql"
    secret.write_text("-- the reader's own\nCREATE VIEW link AS SELECT 1 AS x")
    lake = lake_with_views(
        tmp_path,
        {"big.sql": "CREATE VIEW big AS SELECT 1 AS x" + " " * user_views.MAX_USER_VIEW_BYTES},
    )
    folder = lake / "views"
    (folder / "link.sql").symlink_to(secret)
    os.mkfifo(folder / "fifo.sql")  # opened for reading, it would block until a writer came
    (folder / "dir.sql").mkdir()
    (folder / "latin.sql").write_bytes(b"CREATE VIEW latin AS SELECT '\xe9' AS x")
    (folder / "nul.sql").write_bytes(b"CREATE VIEW nul AS SELECT 1 AS x\x00; DROP VIEW tokens")
    assert build(lake) == [
        skipped(lake, "big.sql", "it is larger than 65536 bytes"),
        skipped(lake, "dir.sql", "it is not a regular file"),
        skipped(lake, "fifo.sql", "it is not a regular file"),
        skipped(lake, "latin.sql", "it is not UTF-8 text (byte 29)"),
        skipped(lake, "link.sql", "it is a symbolic link; tokenlake reads only regular files in `views/`"),
        skipped(lake, "nul.sql", "it holds a NUL character"),
    ]  # fmt: skip
    assert user_objects(lake)[0] == set()


def test_a_views_folder_that_is_a_symlink_is_not_read(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.sql").write_text("CREATE VIEW x AS SELECT 1 AS x")
    lake = tmp_path / "lake"
    lake.mkdir()
    (lake / "views").symlink_to(elsewhere)
    write_rows(lake, schema.RUNS, RUNS)
    assert build(lake) == [
        f"User view `{lake / 'views'}` skipped: it is a symbolic link; user views are read only"
        " from a real folder."
    ]
    assert user_objects(lake)[0] == set()


def test_good_views_build_on_tokenlake_and_on_each_other(tmp_path: Path) -> None:
    lake = lake_with_views(
        tmp_path,
        {
            "a_total.sql": "CREATE VIEW a_total AS SELECT sum(n) AS total FROM z_per_step",
            "z_per_step.sql": "-- Tokens per step.\n-- Mine.\nCREATE OR REPLACE VIEW z_per_step AS\n"
            "WITH s AS (SELECT run, rollout_id FROM drift_tokens)\n"
            "SELECT rollout_id, count(*) AS n, max(k3_term(0.0)) AS zero,"
            " (SELECT count(*) FROM range(3)) AS three\nFROM s GROUP BY ALL;\n",
            "by_sign.sql": "CREATE VIEW by_sign AS\n"
            "WITH keyed AS (SELECT run, rollout_id, batch_position, '' AS share_scope,"
            " sign(lp_diff) AS sign, lp_diff, abs_lp_diff, k3 FROM drift_tokens)\n"
            "SELECT sign, tokens FROM drift_breakdown(keyed)",
        },
    )
    assert build(lake) == []
    assert query(lake, "SELECT * FROM z_per_step") == [(0, 3, 0.0, 3)]
    assert query(lake, "SELECT total FROM a_total") == [(3,)]
    assert query(lake, "SELECT sign, tokens FROM by_sign ORDER BY sign") == [(-1.0, 2), (1.0, 1)]
    assert query(lake, "SELECT comment FROM duckdb_views() WHERE view_name = 'z_per_step'") == [
        ("Tokens per step.\nMine.",)
    ]
    assert user_objects(lake) == (
        {"a_total", "by_sign", "z_per_step"},
        TOKENLAKE_MACROS,
        ["system", "temp", "tokenlake"],
    )


# --- an object-store lake: every reader builds the catalog, so every reader checks -------------


@pytest.mark.slow
def test_a_reader_of_a_bucket_never_runs_its_views(tmp_path: Path) -> None:
    import fsspec

    from tests.fixture_paths import REAL_DUMPS
    from tests.s3server import list_keys, moto_server, new_bucket
    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    written = tmp_path / "written.txt"
    with moto_server():
        bucket = new_bucket()
        url = f"s3://{bucket}/lake"
        extract_run(REAL_DUMPS / "basic", store_of(url), ExtractOptions(run_name="basic"))
        views = {
            "a.sql": f"/* /* */ CREATE VIEW a AS SELECT 1 */ COPY (SELECT 42) TO '{written}'",
            "loot.sql": "/* /* */ CREATE VIEW loot AS SELECT 1 */ COPY (SELECT content FROM"
            f" read_text('/proc/self/environ')) TO 's3://{bucket}/loot.txt'",
            "peek.sql": "CREATE VIEW peek AS SELECT content FROM read_text('/proc/self/environ')",
            "mine.sql": "CREATE VIEW mine AS SELECT count(*) AS n FROM step_stats",
            "huge.sql": "CREATE VIEW huge AS SELECT 1 AS x" + " " * (1 << 20),  # only 64 KiB read
        }
        fs = fsspec.filesystem("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
        for name, text in views.items():
            fs.pipe(f"{bucket}/lake/views/{name}", text.encode())
        keys = list_keys(bucket)
        done = subprocess.run(
            [sys.executable, "-m", "tokenlake", "query", url, "SELECT n FROM mine"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert (done.returncode, done.stdout) == (0, "n\n-\n2\n(1 row)\n")
        read_text = (
            "it calls table function `read_text`; a user view may read only the lake's tables"
            " and views (and generate_series, range, unnest)"
        )
        assert done.stderr.splitlines() == [
            f"Warning: User view `{url}/views/{name}` skipped: {why}."
            for name, why in (
                ("a.sql", FORM.format("a")),
                ("huge.sql", "it is larger than 65536 bytes"),
                ("loot.sql", FORM.format("loot")),
                ("peek.sql", read_text),
            )
        ]
        import tokenlake

        opened = tokenlake.open_lake(url)
        try:
            assert opened.sql("SELECT n FROM mine").fetchall() == [(2,)]
        finally:
            opened.close()
        assert list_keys(bucket) == keys  # no loot.txt, nothing else
    assert not written.exists()


# --- views that multiply: DuckDB binds a view again wherever it is read -----------------------

EXPANDS = (
    "binding it would bind more than 500 tables and views (DuckDB binds a view again at every"
    " place a query reads it)"
)


def test_views_that_double_at_each_step_are_refused_from_the_one_past_the_bound(
    tmp_path: Path,
) -> None:
    """v_k = v_(k-1) UNION ALL v_(k-1): 23 such files of 1.6 KB made every reader bind 2^23
    times (hours); 14 are enough to show the bound, and take seconds without it."""
    files = {"v00.sql": "CREATE VIEW v00 AS SELECT run FROM runs"}
    for k in range(1, 14):
        files[f"v{k:02}.sql"] = (
            f"CREATE VIEW v{k:02} AS SELECT * FROM v{k - 1:02} UNION ALL SELECT * FROM v{k - 1:02}"
        )
    lake = lake_with_views(tmp_path, files)
    # v_k binds 2 (1 + v_(k-1)'s): v07 382 tables and views, v08 766
    assert build(lake) == [skipped(lake, f"v{k:02}.sql", EXPANDS) for k in range(8, 14)]
    assert query(lake, "SELECT count(*) FROM v07") == [(128,)]
    code = CliRunner().invoke(main, ["query", str(lake), "SELECT count(*) AS n FROM v07"])
    assert (code.exit_code, code.output.splitlines()[-1]) == (0, "(1 row)")


def test_one_file_reading_a_view_many_times_counts_each_read(tmp_path: Path) -> None:
    many = " UNION ALL ".join(["SELECT * FROM twice"] * 167)
    lake = lake_with_views(
        tmp_path,
        {
            "twice.sql": "CREATE VIEW twice AS SELECT run FROM runs UNION ALL SELECT run FROM runs",
            "wide.sql": f"CREATE VIEW wide AS {many}",  # 167 x (1 + 2) bindings
            "cte.sql": "CREATE VIEW cte AS WITH twice AS (SELECT 1 AS x) SELECT * FROM twice",
        },
    )
    assert build(lake) == [skipped(lake, "wide.sql", EXPANDS)]
    assert query(lake, "SELECT * FROM cte") == [(1,)]  # a CTE of a view's name reads no view


def test_expanded_reads_of_a_cycle_and_a_long_chain() -> None:
    cycle = user_views.bindings({"a": Counter({"b": 1}), "b": Counter({"a": 1})})
    assert cycle == {"a": 501, "b": 501}
    chain = {f"v{k}": Counter({f"v{k - 1}": 1}) for k in range(1, 5_000)}
    chain["v0"] = Counter({"tokens": 1})
    found = user_views.bindings(chain)  # no recursion limit hit
    assert (found["v0"], found["v499"], found["v500"], found["v4999"]) == (1, 500, 501, 501)


def test_many_views_together_stay_within_the_total(tmp_path: Path) -> None:
    """Each of 6 files binds 400 (within 500): the first five fit the total of 2,000."""
    many = " UNION ALL ".join(["SELECT run FROM runs"] * 400)
    lake = lake_with_views(tmp_path, {f"w{k}.sql": f"CREATE VIEW w{k} AS {many}" for k in range(6)})
    total = (
        "the user views before it (by file name) bind 2,000 tables and views; together they may"
        " bind at most 2,000"
    )
    assert build(lake) == [skipped(lake, "w5.sql", total)]
