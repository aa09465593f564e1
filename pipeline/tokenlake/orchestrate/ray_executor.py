"""Extract steps on a Ray cluster: one Ray task per step, the driver commits.

Each task runs `tokenlake.orchestrate.step.extract_step` where Ray places it: it reads the step's files and
writes the step's Parquet files under fresh names, on a file system every node sees (a shared
mount), and returns a plain `StepOutcome`. Only the driver (`extract_run`) lists files in a
manifest and builds the catalog, so the commit protocol is the same as with local workers: a
task that dies leaves at most unlisted files, which the next publish or extraction deletes.

Ray is the optional extra `tokenlake[ray]`: this module imports it only when steps run.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tokenlake import extras
from tokenlake.errors import shown
from tokenlake.orchestrate.scheduler import Todo
from tokenlake.orchestrate.step import StepOutcome, StepStatus, extract_step
from tokenlake.read import dump
from tokenlake.read.remote import remote_dump
from tokenlake.store.base import Store

log = logging.getLogger(__name__)

# A task whose worker process or node dies is run again this many times before its step is
# reported as failed (Ray's `max_retries`; exceptions inside a task are never retried, since
# extract_step turns every one into an outcome).
MAX_RETRIES = 3
# Tasks handed to Ray per CPU of the cluster: enough to keep every CPU busy while the driver
# commits, few enough that a Ctrl-C leaves little to cancel.
TASKS_PER_CPU = 2


def require_ray() -> None:
    """Fail early, before any work, when the `ray` extra is missing."""
    extras.require("ray", "ray", "Extraction with `--executor ray`")


def run_steps_on_ray(
    todo: list[Todo],
    store: Store,
    run: str,
    *,
    address: str | None = None,
    max_retries: int | None = None,
) -> Iterator[StepOutcome]:
    """Extract the steps as Ray tasks; yields outcomes as steps finish (as `_run_steps`).

    Args:
        todo: (step files, status) pairs, as planned by `extract_run`.
        store: The lake's store, sent to each task pickled (as its location): a local lake
            must be the same path on every node.
        run: The run's name in the lake.
        address: The cluster to connect to (`auto`, `ray://host:10001`, `host:6379`); default:
            the one this process is connected to, else Ray's own choice (`RAY_ADDRESS`, a
            cluster started on this machine, else a new local Ray).
        max_retries: Times a task whose worker or node died is run again; default
            `MAX_RETRIES`.

    Yields:
        One outcome per step; a step whose task keeps dying becomes an outcome with an error.
    """
    if not todo:  # nothing to extract: do not start or join a cluster
        return
    require_ray()
    import ray

    retries = MAX_RETRIES if max_retries is None else max_retries
    connected_here = not ray.is_initialized()
    if connected_here:
        _connect(ray, address)
    remote = ray.remote(num_cpus=1, max_retries=retries)(extract_step)
    window = max(1, int(ray.cluster_resources().get("CPU", 1)) * TASKS_PER_CPU)
    pending = deque(todo)
    running: dict[Any, Todo] = {}
    try:
        while pending or running:
            while pending and len(running) < window:
                files, status = pending.popleft()
                running[remote.remote(files, store, run, status)] = (files, status)
            done, _ = ray.wait(list(running), num_returns=1)
            files, status = running.pop(done[0])
            yield _outcome(ray, done[0], files, status, retries)
    finally:  # stopped early (Ctrl-C, --strict): started steps are not committed anyway
        for ref in running:
            ray.cancel(ref)
        if connected_here:
            ray.shutdown()


def _connect(ray: Any, address: str | None) -> None:
    # Worker output stays on the workers, and Ray says only errors: the CLI's stderr is for
    # one-line messages.
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
    if address is None:
        options["include_dashboard"] = False  # only for a Ray started here; needs ray[default]
    if not starts_private_ray(address):
        ray.init(address=address, **options)
        return
    with _loopback_only(ray):
        ray.init(address=address, _node_ip_address=LOOPBACK, **options)


LOOPBACK = "127.0.0.1"
# Ray turns a node address of 127.0.0.1 into the machine's network address, unless clusters
# are off (its rule for macOS and Windows): then its services listen on 127.0.0.1 only.
_CLUSTERS_VARIABLE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def starts_private_ray(address: str | None) -> bool:
    """Whether `ray.init(address)` starts a new Ray on this machine rather than joining one
    (Ray's own rule: `RAY_ADDRESS`, else a cluster started here with `ray start`)."""
    from ray._private import services

    if address not in (None, "local"):
        return False
    # Ray's type hint says `str`; None is its documented "no address given".
    return services.canonicalize_bootstrap_address(address) is None  # type: ignore[arg-type]


@contextmanager
def _loopback_only(ray: Any) -> Iterator[None]:
    """Start Ray's services bound to 127.0.0.1: nothing of a private Ray (which has no
    authentication of its own) is reachable from the network. The processes Ray starts
    inherit the setting; this process gets its own back afterwards."""
    from ray._private import ray_constants

    saved_env, saved_flag = os.environ.get(_CLUSTERS_VARIABLE), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_CLUSTERS_VARIABLE] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(_CLUSTERS_VARIABLE, None)
        else:
            os.environ[_CLUSTERS_VARIABLE] = saved_env


def _outcome(
    ray: Any, ref: Any, files: dump.StepFiles, status: StepStatus, max_retries: int
) -> StepOutcome:
    """The task's outcome, or the step's one-line failure when Ray could not run it."""
    try:
        outcome: StepOutcome = ray.get(ref)
        return outcome
    except ray.exceptions.RayTaskError as exc:  # raised in the task, outside extract_step's net
        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
        return StepOutcome(files.label, status, error=task_failed_text(files, cause))
    except ray.exceptions.RayError as exc:  # its worker or node died on every try
        log.info("step %s: Ray gave up on its task: %s", files.label, type(exc).__name__)
        return StepOutcome(files.label, status, error=task_died_text(files, max_retries))


def task_died_text(files: dump.StepFiles, max_retries: int) -> str:
    """The one-line failure of a step whose Ray task died on every try.

    Examples:
        >>> from pathlib import Path
        >>> step = dump.StepFiles(3, False, Path("d/rollout_data/3.pt"))
        >>> print(task_died_text(step, 2))
        `d/rollout_data/3.pt`: the Ray task extracting this step died on all 3 tries (its worker or node was killed, ran out of memory or left the cluster). Extract again to retry the step.
        >>> print(task_died_text(step, 0).split(" (")[0])
        `d/rollout_data/3.pt`: the Ray task extracting this step died on its only try
    """
    tries = f"all {max_retries + 1} tries" if max_retries else "its only try"
    text = (
        f"`{files.rollout_file}`: the Ray task extracting this step died on {tries} (its worker"
        " or node was killed, ran out of memory or left the cluster). Extract again to retry"
        " the step."
    )
    return remote_dump.as_urls(files, files, text)  # a remote dump's file by its URL


def task_failed_text(files: dump.StepFiles, cause: BaseException) -> str:
    """The one-line failure of a task that raised outside extract_step (e.g. tokenlake is not
    installed on the node, so the function cannot be loaded).

    Examples:
        >>> from pathlib import Path
        >>> step = dump.StepFiles(3, False, Path("d/rollout_data/3.pt"))
        >>> print(task_failed_text(step, ModuleNotFoundError("No module named 'tokenlake'")))
        `d/rollout_data/3.pt`: the Ray task extracting this step failed with ModuleNotFoundError("No module named 'tokenlake'"). Install tokenlake on every node of the cluster, then extract again.
    """
    text = (
        f"`{files.rollout_file}`: the Ray task extracting this step failed with"
        f" {type(cause).__name__}({shown(str(cause))}). Install tokenlake on every node of the"
        " cluster, then extract again."
    )
    return remote_dump.as_urls(files, files, text)
