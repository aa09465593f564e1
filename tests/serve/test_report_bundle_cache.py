"""The report's Vega bundle is built once per vl-convert and Vega-Lite version, then read from
tokenlake's private cache; a cache that cannot be trusted is never read."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import altair
import pytest
import vl_convert

from tokenlake.serve import report_html as rh


@pytest.fixture
def bundles(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """A cache in `tmp_path/cache`; vl-convert's bundler replaced by one that records calls."""
    monkeypatch.setenv("TOKENLAKE_CACHE", str(tmp_path / "cache"))
    calls: list[str] = []

    def bundle(snippet: str, vl_version: str) -> str:
        calls.append(vl_version)
        return f"/* bundle {vl_version} */ {snippet}"

    monkeypatch.setattr(vl_convert, "javascript_bundle", bundle)
    return calls


def _cached(tmp_path: Path) -> Path:
    major_minor = ".".join(altair.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    version = importlib.metadata.version("vl-convert-python")
    return tmp_path / "cache" / "report" / f"vega-bundle-{version}-vl{major_minor}.js"


def test_second_bundle_is_read_from_the_cache(bundles: list[str], tmp_path: Path) -> None:
    first = rh.vega_bundle()
    second = rh.vega_bundle()
    assert second == first
    assert len(bundles) == 1
    assert _cached(tmp_path).read_text(encoding="utf-8") == first
    assert _cached(tmp_path).parent.stat().st_mode & 0o777 == 0o700


def test_a_link_in_the_cache_is_not_followed(bundles: list[str], tmp_path: Path) -> None:
    rh.vega_bundle()
    planted = tmp_path / "planted.js"
    planted.write_text("alert('not ours')", encoding="utf-8")
    _cached(tmp_path).unlink()
    _cached(tmp_path).symlink_to(planted)
    assert "not ours" not in rh.vega_bundle()
    assert len(bundles) == 2


def test_a_cache_others_may_write_is_neither_read_nor_written(
    bundles: list[str], tmp_path: Path
) -> None:
    (tmp_path / "cache").mkdir(mode=0o700)
    (tmp_path / "cache").chmod(0o777)
    text = rh.vega_bundle()
    assert text.startswith("/* bundle ")
    assert rh.vega_bundle() == text
    assert len(bundles) == 2
    assert not (tmp_path / "cache" / "report").exists()


def test_an_empty_cached_file_is_built_again(bundles: list[str], tmp_path: Path) -> None:
    rh.vega_bundle()
    _cached(tmp_path).write_text("", encoding="utf-8")
    assert rh.vega_bundle().startswith("/* bundle ")
    assert len(bundles) == 2
