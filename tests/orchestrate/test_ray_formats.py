"""`--executor ray` reads every dump format: slime's format 2, NeMo-RL's logs and prime-rl's
token exports give on a Ray cluster the lake a local extraction gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.fixture_paths import NEMO_RL_REAL, PRIME_RL_REAL, SLIME_REAL
from tests.s3server import rows
from tokenlake.orchestrate.extract import ExtractOptions, extract_run

pytestmark = pytest.mark.slow  # a Ray cluster

NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20}  # Ray's floor is ~75 MB


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster  # imported by the tests that run one, not at collection

    ray_cluster = Cluster(initialize_head=True, head_node_args={**NODE, "num_cpus": 0})
    for _ in range(2):
        ray_cluster.add_node(**NODE)
    ray_cluster.wait_for_nodes()
    yield ray_cluster
    ray_cluster.shutdown()


@pytest.mark.parametrize(
    ("dump", "steps"),
    [
        (SLIME_REAL / "v2_dp2_cp2", 4),
        (NEMO_RL_REAL / "grpo_multiturn", 4),
        (PRIME_RL_REAL / "packed_2ranks", 2),
    ],
    ids=["slime-v2", "nemo-rl", "prime-rl"],
)
def test_ray_tasks_read_every_format(cluster, dump: Path, steps: int, tmp_path: Path) -> None:
    far = extract_run(
        dump,
        store_of(tmp_path / "ray"),
        ExtractOptions(executor="ray", ray_address=cluster.address),
    )
    near = extract_run(dump, store_of(tmp_path / "local"), ExtractOptions(workers=1))
    assert (far.failed, far.dump_format, far.counts["new"]) == ([], near.dump_format, steps)
    for sql in ("SELECT * FROM tokens", "SELECT * FROM samples"):
        assert rows(tmp_path / "ray", sql) == rows(tmp_path / "local", sql) != []
