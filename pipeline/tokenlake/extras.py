"""Optional dependencies: what needs them, and the extra that installs them.

Extraction never imports torch (the `.pt` reader is our own); only the dump generator, the
benchmark's baseline and some tests do, so torch is the `synth` extra, not a dependency.
"""

from __future__ import annotations

import importlib

from tokenlake.errors import PipelineError


class MissingDependencyError(PipelineError):
    """An optional dependency is missing; the message names the extra that installs it."""

    def __init__(self, module: str, extra: str, purpose: str) -> None:
        self.module = module
        self.extra = extra
        self.purpose = purpose
        target = "setup" if extra in SETUP_EXTRAS else "setup-test"
        super().__init__(
            f"{purpose} needs `{module}`, which is not installed: run"
            f" `pip install 'tokenlake[{extra}]'` (`make {target}` installs it)."
        )


# The extras `make setup` installs (the Makefile's RUN_EXTRAS); `make setup-test` has all.
SETUP_EXTRAS = frozenset({"synth", "duckdb-cli"})


def require(module: str, extra: str, purpose: str) -> None:
    """Raise MissingDependencyError unless `module` can be imported.

    Examples:
        >>> require("json", "none", "Reading JSON")
    """
    try:  # imported, not just found: the caller imports it next anyway
        importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(module, extra, purpose) from None


def require_torch(purpose: str) -> None:
    """torch comes with the `synth` extra."""
    require("torch", "synth", purpose)
