"""Token texts from the dump's `tokenizer/` folder (dump-format.md 1), for the `vocab` table.

Each id is decoded on its own, as the reference token view does, with special tokens kept.
The `tokenizers` package reads `tokenizer.json` directly; no model hub is contacted.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from tokenlake import bounded, schema
from tokenlake.errors import BoundedReadError, DumpFormatError

# The largest published tokenizer.json files are ~35 MB (Gemma 3: 33 MB, 262k tokens).
MAX_TOKENIZER_BYTES = 64 * bounded.MiB


def vocab_table(path: Path, within: Path | None = None) -> pa.Table:
    """One row per token id of the tokenizer: its id and its text decoded alone (an id it
    does not have has no row: its tokens' text is NULL).

    A file that is not a regular file, or larger than `MAX_TOKENIZER_BYTES`, is a
    `DumpFormatError` before anything is parsed.

    Examples:
        >>> import json, tempfile
        >>> spec = {"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1},
        ...         "unk_token": "a"}}
        >>> with tempfile.TemporaryDirectory() as d:
        ...     p = Path(d) / "tokenizer.json"
        ...     _ = p.write_text(json.dumps(spec))
        ...     vocab_table(p).to_pylist()
        [{'token_id': 0, 'token_text': 'a'}, {'token_id': 1, 'token_text': 'b'}]
        >>> spec["model"]["vocab"] = {"a": 0, "b": 3}  # no id 1 or 2
        >>> with tempfile.TemporaryDirectory() as d:
        ...     p = Path(d) / "tokenizer.json"
        ...     _ = p.write_text(json.dumps(spec))
        ...     vocab_table(p).to_pylist()
        [{'token_id': 0, 'token_text': 'a'}, {'token_id': 3, 'token_text': 'b'}]
    """
    from tokenizers import Tokenizer

    try:
        data = bounded.read_file(path, MAX_TOKENIZER_BYTES, "a `tokenizer.json`", within=within)
    except BoundedReadError as exc:
        raise DumpFormatError(path, exc.problem) from exc
    try:
        tokenizer = Tokenizer.from_buffer(data)
        # The ids it has: its size counts them, so ids with a gap below them would make it
        # decode ids it lacks (as "") and leave out its highest ones.
        ids = sorted(set(tokenizer.get_vocab(with_added_tokens=True).values()))
        texts = tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)
    except (KeyboardInterrupt, SystemExit):
        raise
    # The tokenizers library raises bare Exceptions on bad files, and its Rust panics are a
    # pyo3 PanicException, which derives from BaseException.
    except BaseException as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise DumpFormatError(path, f"is not a readable tokenizer ({reason})") from exc
    return pa.table(
        {schema.TOKEN_ID: pa.array(ids, pa.int64()), "token_text": pa.array(texts)},
        schema=schema.VOCAB_SCHEMA,
    )
