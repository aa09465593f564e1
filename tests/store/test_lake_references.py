"""What a lake may reference, whom `verify` contacts, and what reaches the user's terminal.

A manifest may list only files of its own run's partitions, each once: another run's file
(rows doubled) or a path outside the lake is a damaged manifest, and its rows are never
served. `verify` reads a `source_dir` only as a directory or an object-store URL: a manifest
naming `http://127.0.0.1:PORT/...` makes no request. Names and values from the lake reach the
terminal with control characters escaped. A lake URL inside a dump's prefix is refused
whatever the scheme spelling (`s3a://` for `s3://`).
"""

from __future__ import annotations

import copy
import http.server
import json
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tokenlake.cli import main
from tokenlake.orchestrate.extract import overlap

ROWS_SQL = "SELECT run, count(*) AS n FROM tokens GROUP BY run ORDER BY run"
WAY_OUT = ". Remove the run with `tokenlake drop LAKE pp2` or extract it again"


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def lake(basic_and_pp2_lake: Path) -> Path:
    return basic_and_pp2_lake


def forge(lake: Path, run: str, change) -> Path:
    path = lake / "_manifest" / f"{run}.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


def basic_tokens_file(lake: Path) -> str:
    data = json.loads((lake / "_manifest" / "basic.json").read_text())
    return data["steps"]["0"]["files"]["tokens"]


@pytest.mark.slow
def test_a_manifest_listing_another_runs_file_is_damaged(lake: Path) -> None:
    stolen = basic_tokens_file(lake)

    def steal(data):
        data["steps"]["0"]["files"]["tokens"] = stolen

    path = forge(lake, "pp2", steal)
    line = (
        f"Error: Lake `{path}`: manifest is damaged: it lists `{stolen}` for `tokens`, which is"
        f" not a file of this run's partition `tokens/run=pp2/rollout_id=0`{WAY_OUT}\n"
    )
    assert cli("views", str(lake)) == (1, "", line)
    assert cli("verify", str(lake)) == (1, "", line)
    # A query builds its views from the manifests: it says so too, never counting a row twice.
    assert cli("query", str(lake), ROWS_SQL) == (1, "", line)


@pytest.mark.slow
def test_a_manifest_listing_a_file_outside_the_lake_is_damaged(lake: Path) -> None:
    def point_outside(data):
        data["runs_file"] = "/etc/passwd"

    path = forge(lake, "pp2", point_outside)
    line = (
        f"Error: Lake `{path}`: manifest is damaged: it lists `/etc/passwd`, which lies outside"
        f" the lake{WAY_OUT}\n"
    )
    assert cli("views", str(lake)) == (1, "", line)
    assert cli("verify", str(lake)) == (1, "", line)


@pytest.mark.slow
def test_a_manifest_listing_one_file_twice_is_damaged(lake: Path) -> None:
    def twice(data):
        data["metrics_files"] = [data["runs_file"].replace("runs/", "metrics/")] * 2

    path = forge(lake, "pp2", twice)
    code, out, err = cli("verify", str(lake))
    name = json.loads(path.read_text())["metrics_files"][0]
    assert (code, out, err) == (
        1,
        "",
        f"Error: Lake `{path}`: manifest is damaged: it lists `{name}` twice{WAY_OUT}\n",
    )


@pytest.mark.slow
def test_a_manifest_listing_a_step_twice_is_damaged(lake: Path) -> None:
    # Two records of step 0, the second under a key of its own, each listing its own copy of
    # the step's files: every command served the step's rows twice, with exit 0.
    def twice(data):
        again = copy.deepcopy(data["steps"]["0"])
        for table, name in again["files"].items():
            again["files"][table] = re.sub(r"-[0-9a-f]{8}\.parquet\Z", "-0badc0de.parquet", name)
            shutil.copy(lake / name, lake / again["files"][table])
        data["steps"]["again"] = again

    path = forge(lake, "pp2", twice)
    line = (
        f"Error: Lake `{path}`: manifest is damaged: it lists step `0` twice (as `0` and"
        f" `again`){WAY_OUT}\n"
    )
    assert cli("query", str(lake), ROWS_SQL) == (1, "", line)
    assert cli("verify", str(lake)) == (1, "", line)


@pytest.mark.slow
def test_a_folder_under_a_manifests_name_says_to_remove_it(lake: Path) -> None:
    # Its way out was `tokenlake drop LAKE x`, which failed on it ("manifest cannot be
    # written (Is a directory)"), as would an extraction: both rename a file over it.
    planted = lake / "_manifest" / "x.json"
    planted.mkdir()
    line = (
        f"Error: Lake `{planted}`: manifest is damaged: it is a directory, not a regular file."
        " It is no file tokenlake wrote, and no tokenlake command replaces it: remove it\n"
    )
    assert cli("query", str(lake), ROWS_SQL) == (1, "", line)
    assert cli("verify", str(lake)) == (1, "", line)
    planted.rmdir()
    assert cli("verify", str(lake))[:2] == (0, "6 steps checked, 0 problems\n")


INT64 = "9,223,372,036,854,775,807"
# What each forged value of a step (or of the run) made a command do before it was damaged:
# a TypeError traceback (a text `rollout_id` or `schema_version` compared with ints), a
# confusing verify line ("`samples` has 8 rows; extracted 8"), or nothing at all.
WRONG_VALUES = {
    "rollout_id as text": (
        lambda step, data: step.update(rollout_id="0"),
        f"its step `0`: `rollout_id` is '0', not a whole number from 0 to {INT64}",
    ),
    "schema_version as text": (
        lambda step, data: step.update(schema_version="5"),
        f"its step `0`: `schema_version` is '5', not a whole number from 0 to {INT64}",
    ),
    "samples as text": (
        lambda step, data: step.update(samples="8"),
        f"its step `0`: `samples` is '8', not a whole number from 0 to {INT64}",
    ),
    "negative tokens": (
        lambda step, data: step.update(tokens=-5),
        f"its step `0`: `tokens` is -5, not a whole number from 0 to {INT64}",
    ),
    "train_files beyond int64": (
        lambda step, data: step.update(train_files=2**63),
        f"its step `0`: `train_files` is {2**63}, not a whole number from 0 to {INT64}",
    ),
    "evaluation as text": (
        lambda step, data: step.update(evaluation="no"),
        "its step `0`: `evaluation` is 'no', not true or false",
    ),
    "checksum as number": (
        lambda step, data: step.update(checksum=5),
        "its step `0`: `checksum` is 5, not a text",
    ),
    "source size as text": (
        lambda step, data: step["sources"][0].update(size="4553"),
        f"its step `0`: a source's `size` is '4553', not a whole number from 0 to {INT64}",
    ),
    "key of another step": (
        lambda step, data: data["steps"].update({"7": data["steps"].pop("0")}),
        "it lists step `0` under the key `7`",
    ),
    "key with control characters": (
        lambda step, data: data["steps"].update({"0\x1b[2J": data["steps"].pop("0")}),
        "it lists step `0` under the key `0\\x1b[2J`",
    ),
    "a tag holding a lone surrogate": (  # query and tag: UnicodeEncodeError tracebacks
        lambda step, data: data.update(tags={"a": "\udc80"}),
        "it holds '\\udc80', text UTF-8 cannot hold (a lone surrogate)",
    ),
    "metrics offset as text": (
        lambda step, data: data.update(metrics_sources={"m": {"offset": "a", "head": ""}}),
        f"its `metrics_sources` entry `m`: `offset` is 'a', not a whole number from 0 to {INT64}",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("forged", sorted(WRONG_VALUES))
def test_a_manifest_value_of_another_type_is_damaged(lake: Path, forged: str) -> None:
    change, problem = WRONG_VALUES[forged]
    path = forge(lake, "pp2", lambda data: change(data["steps"]["0"], data))
    line = f"Error: Lake `{path}`: manifest is damaged: {problem}{WAY_OUT}\n"
    assert cli("query", str(lake), ROWS_SQL) == (1, "", line)
    assert cli("verify", str(lake)) == (1, "", line)
    assert cli("tag", str(lake), "basic", "a=b") == (1, "", line)


@pytest.fixture
def http_server() -> Iterator[tuple[int, list[str]]]:
    """A local HTTP server that records every request it gets."""
    seen: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append(self.path)
            self.send_response(200)
            self.end_headers()

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_verify_contacts_no_url_a_manifest_names(lake: Path, http_server) -> None:
    port, seen = http_server
    url = f"http://127.0.0.1:{port}/internal/admin"

    def elsewhere(data):
        data["source_dir"] = url

    forge(lake, "pp2", elsewhere)
    code, out, err = cli("verify", str(lake))
    assert (code, err) == (1, "")
    assert out == (
        f"run `pp2`: sources not checked: its dump `{url}` is neither a directory nor an"
        " object-store URL (s3://, gs://, az://); verify contacts nothing else\n"
        "6 steps checked, 1 problem\n"
    )
    assert seen == []


@pytest.mark.slow
def test_verify_escapes_control_characters_of_manifest_names(lake: Path) -> None:
    run = "evil\x1b]0;pwned\x07\rX"
    shown = "evil\\x1b]0;pwned\\x07\\x0dX"
    folder = f"run={run}/rollout_id=0"
    record = {
        "run": run,
        "source_dir": str(lake / "nowhere"),
        "version": 1,
        "steps": {
            "0": {
                "rollout_id": 0,
                "evaluation": False,
                "sources": [],
                "files": {
                    "tokens": f"tokens/{folder}/train-00000000.parquet",
                    "samples": f"samples/{folder}/train-00000000.parquet",
                },
                "samples": 1,
                "tokens": 1,
                "train_files": 1,
                "checksum": "",
            }
        },
    }
    (lake / "_manifest" / f"{run}.json").write_text(json.dumps(record))
    code, out, err = cli("verify", str(lake))
    assert (code, err) == (1, "")
    assert out == (
        f"run `{shown}` step 0: file `tokens/run={shown}/rollout_id=0/"
        "train-00000000.parquet` is missing\n"
        f"run `{shown}` step 0: file `samples/run={shown}/rollout_id=0/"
        "train-00000000.parquet` is missing\n"
        "catalog `tokenlake.duckdb` lists other files than the manifests (a command was"
        " interrupted before rebuilding it); run `tokenlake views LAKE` or extract again\n"
        "7 steps checked, 3 problems\n"
    )


@pytest.mark.slow
def test_query_table_cells_escape_control_characters(lake: Path) -> None:
    sql = "SELECT 'a' || chr(27) || ']0;pwned' || chr(7) || chr(13) || 'b' AS \"t\x1b[2J\""
    assert cli("query", str(lake), sql) == (
        0,
        "t\\x1b[2J\n" + "-" * 22 + "\na\\x1b]0;pwned\\x07\\x0db\n(1 row)\n",
        "",
    )
    # Data formats stay data: JSON escapes by itself, CSV keeps the bytes.
    code, out, _ = cli("query", str(lake), sql, "--format", "json")
    assert (code, out) == (0, '{"t\\u001b[2J": "a\\u001b]0;pwned\\u0007\\rb"}\n')


@pytest.mark.parametrize(
    ("lake_url", "problem"),
    [
        ("s3://b/run/lake", "is inside the dump `s3://b/run`"),
        ("s3a://b/run/lake", "is inside the dump `s3://b/run`"),
        ("s3n://b/run/lake", "is inside the dump `s3://b/run`"),
        ("S3A://b//run/lake/", "is inside the dump `s3://b/run`"),
        ("s3a://b/run", "is the dump `s3://b/run` itself"),
        ("s3a://b/", "holds the dump `s3://b/run`"),
    ],
)
def test_a_lake_overlapping_the_dump_is_refused_whatever_the_scheme(
    lake_url: str, problem: str
) -> None:
    assert overlap("s3://b/run", lake_url) == problem


@pytest.mark.parametrize("lake_url", ["s3a://b/runs", "s3://c/run/lake", "gs://b/run/lake"])
def test_a_lake_beside_the_dump_is_accepted(lake_url: str) -> None:
    assert overlap("s3://b/run", lake_url) is None


def test_a_dump_inside_the_lakes_tables_is_refused() -> None:
    assert overlap("s3://b/lake/tokens/run", "s3a://b/lake") == (
        "holds the dump `s3://b/lake/tokens/run`"
    )
