"""HTML pieces of the report and the page around them: one self-contained file.

The page inlines its style sheet, its script and the Vega/Vega-Lite/Vega-Embed bundle that
the `vl-convert-python` package ships, so it opens with no network and no server. Text from
the lake (run names, token texts, audit rows) is escaped; JSON in `<script>` has `<`, `>` and `&`
as `\\u` escapes.
"""

from __future__ import annotations

import html
import importlib.metadata
import importlib.resources
import json
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenlake.errors import CacheError, LakeError
from tokenlake.serve.report_charts import VEGA_LITE_VERSION, Chart
from tokenlake.store.local import atomic_write
from tokenlake.store.private_cache import cache_root, private_folder

ASSETS = Path(str(importlib.resources.files("tokenlake.serve"))) / "report_assets"

# The bundle's entry snippet: put the three libraries on `window` for the page's script.
_GLOBALS = "window.vegaEmbed = vegaEmbed; window.vega = vega; window.vegaLite = vegaLite;"


# A bundle is ~0.9 MB; a cached file larger than this is not one of ours.
MAX_BUNDLE_BYTES = 16 * 2**20


def vega_bundle() -> str:
    """Vega, Vega-Lite and Vega-Embed as one script that sets them on `window` (offline).

    The Vega-Lite version is the one the specs are written for (`report_charts`, e.g. 6.4). Bundling takes
    vl-convert 1.3-1.9 CPU-s, most of a report's build, and gives the same text for the same
    vl-convert and Vega-Lite versions: it is kept in tokenlake's private cache
    (`$TOKENLAKE_CACHE/report/`, a folder only the user can write) under a name holding both
    versions, and read from there by the next report. A cache that cannot be used (not
    private, unwritable, damaged) only costs the bundling again.
    """
    import vl_convert

    major_minor = ".".join(VEGA_LITE_VERSION.lstrip("v").split(".")[:2])
    version = importlib.metadata.version("vl-convert-python")
    name = f"vega-bundle-{version}-vl{major_minor}.js"
    cached = _read_cached_bundle(name)
    if cached is not None:
        return cached
    bundle = str(vl_convert.javascript_bundle(_GLOBALS, vl_version=major_minor))
    _cache_bundle(name, bundle)
    return bundle


def _bundle_folder() -> Path:
    """The private folder of cached bundles (CacheError or OSError when it cannot be one)."""
    root = private_folder(cache_root(), root=True)
    return private_folder(root / "report")


def _read_cached_bundle(name: str) -> str | None:
    """A cached bundle's text, or None when there is none fit to use: never through a link,
    bounded in size. It is whole: only tokenlake writes in the private folder, by rename."""
    try:
        descriptor = os.open(_bundle_folder() / name, os.O_RDONLY | os.O_NOFOLLOW)
    except (CacheError, OSError):
        return None
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            return None
        raw = file.read(MAX_BUNDLE_BYTES + 1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if 0 < len(raw) <= MAX_BUNDLE_BYTES else None


def _cache_bundle(name: str, bundle: str) -> None:
    """Keep `bundle` for the next report: written beside its place, then renamed, so a
    reader never sees half of it. Best effort: a report never fails for its cache."""
    try:
        target = _bundle_folder() / name
        atomic_write(target, lambda temporary: _write_text(temporary, bundle))
    except (CacheError, LakeError, OSError):
        return


def _write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


# Run names up to this long are shown whole; longer ones lose what all the runs share.
SHORT_RUN = 24
_PARTS = re.compile(r"([-_./ ]+)")  # the separators a run name splits at (kept)


def short_runs(runs: Sequence[str]) -> dict[str, str]:
    """A label per run for legends: long names lose the parts (between `-`, `_`, `.`, `/`
    or spaces) that every run's name starts or ends with, so the middle that tells runs apart
    stays; `…` marks what was cut. Names are kept whole when all are short, when there is one
    run, or when cutting would make two labels equal.

    Examples:
        >>> short_runs(["qwen3-30b-a3b-grpo-bf16-lr1e-6-0", "qwen3-30b-a3b-grpo-fp8-lr1e-6-0"])
        {'qwen3-30b-a3b-grpo-bf16-lr1e-6-0': '…bf16…', 'qwen3-30b-a3b-grpo-fp8-lr1e-6-0': '…fp8…'}
        >>> short_runs(["tp-a", "tp-b"])
        {'tp-a': 'tp-a', 'tp-b': 'tp-b'}
    """
    whole = {run: run for run in runs}
    if len(runs) < 2 or all(len(run) <= SHORT_RUN for run in runs):
        return whole
    split = [_PARTS.split(run) for run in runs]  # words at even indexes, separators between
    head = _common(split)
    tail = _common([parts[::-1] for parts in split])
    # Leave every name a word of its own.
    while head + tail and any(len(parts) - head - tail < 1 for parts in split):
        head, tail = (head - 2, tail) if head >= tail else (head, tail - 2)
    labels = {
        run: ("…" if head else "")
        + "".join(parts[head : len(parts) - tail]).strip("-_./ ")
        + ("…" if tail else "")
        for run, parts in zip(runs, split, strict=True)
    }
    return labels if len(set(labels.values())) == len(runs) else whole


def _common(split: Sequence[list[str]]) -> int:
    """How many leading parts, ending after a separator, every name shares (even: words and
    the separators after them)."""
    shortest = min(len(parts) for parts in split)
    count = 0
    while count + 1 < shortest and all(p[count : count + 2] == split[0][count : count + 2]
                                       for p in split):  # fmt: skip
        count += 2
    return count


def cell(value: Any) -> str:
    """A table cell's text: numbers to 6 significant digits, None as an em dash.

    Examples:
        >>> [cell(None), cell(0.000123456789), cell(12), cell(True), cell("<b>")]
        ['—', '0.000123457', '12', 'true', '&lt;b&gt;']
    """
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    return html.escape(str(value))


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An HTML table; numeric cells align right."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"num" if isinstance(v, int | float) else ""}">{cell(v)}</td>' for v in row
        )
        + "</tr>"
        for row in rows
    )
    return f'<div class="table"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def note(text: str) -> str:
    """A sentence shown instead of a chart or beside it (empty or missing data)."""
    return f'<p class="note">{html.escape(text)}</p>'


def chart_div(chart: Chart, kind: str = "chart") -> str:
    """The element a chart draws into, in its card: the card has the padding, so a chart
    sized to its container (`width: "container"`) fits inside it."""
    return f'<div class="card"><div class="{kind}" id="{html.escape(chart.id)}"></div></div>'


def folded(summary: str, body: Sequence[str]) -> str:
    """Parts of a section that are closed until clicked (`summary` is their one line)."""
    return (
        f'<details class="folded"><summary>{html.escape(summary)}</summary>'
        + "\n".join(body)
        + "</details>"
    )


def section(anchor: str, title: str, body: Sequence[str]) -> str:
    """One numbered section of the page."""
    return f'<section id="{anchor}"><h2>{html.escape(title)}</h2>' + "\n".join(body) + "</section>"


# Characters that could end or confuse a `<script>` element (`</script>`, `<!--`), or an
# entity, and the two line terminators older JavaScript refuses: as JSON's `\uXXXX` escapes,
# which JSON.parse turns back into the same text.
_SCRIPT_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def script_json(payload: Any) -> str:
    """JSON safe inside a `<script>` element: valid JSON (`JSON.parse` reads it back
    exactly) in which no `<`, `>` or `&` appears.

    Examples:
        >>> print(script_json({"a": "</script><!--&"}))
        {"a": "\\u003c/script\\u003e\\u003c!--\\u0026"}
        >>> json.loads(script_json({"a": "</script><!--"})) == {"a": "</script><!--"}
        True
    """
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False)
    for char, escape in _SCRIPT_ESCAPES.items():
        text = text.replace(char, escape)
    return text


def page(title: str, header: str, sections: Sequence[str], payload: Any, bundle: str) -> str:
    """The whole document."""
    css = (ASSETS / "report.css").read_text(encoding="utf-8")
    script = (ASSETS / "report.js").read_text(encoding="utf-8")
    toc = "".join(
        f'<li><a href="#{anchor}">{html.escape(name)}</a></li>' for anchor, name in _toc(sections)
    )
    inline_bundle = bundle.replace("</script", "<\\/script")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<title>{html.escape(title)}</title>
<style>{css}</style>
<script>{inline_bundle}</script>
</head><body>
<header>{header}<nav><ol>{toc}</ol></nav></header>
<main>{"".join(sections)}</main>
<script type="application/json" id="report-data">{script_json(payload)}</script>
<script>{script}</script>
</body></html>
"""


def _toc(sections: Sequence[str]) -> list[tuple[str, str]]:
    entries = []
    for text in sections:
        anchor = text.split('id="', 1)[1].split('"', 1)[0]
        name = html.unescape(text.split("<h2>", 1)[1].split("</h2>", 1)[0])
        entries.append((anchor, name))
    return entries
