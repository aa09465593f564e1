"""`benchmarks.bench` times every aggregate view against a plain scan of `tokens`."""

from __future__ import annotations

from benchmarks import bench
from tests.lakes import build_lake
from tokenlake.serve import sql_views


def test_view_ratios_cover_every_aggregate_view(tmp_path, capsys):
    tokens = [
        {
            "run": "r",
            "rollout_id": 0,
            "batch_position": 0,
            "position": p,
            "token_id": 3,
            "loss_mask": 1,
            "train_log_prob": -1.0,
            "rollout_log_prob": -1.1,
            "lp_diff": 0.1,
        }
        for p in range(4)
    ]
    build_lake(tmp_path, tokens=tokens)
    ratios = bench.view_ratios(tmp_path, repeat=1)
    views = [p.stem for p in sql_views.iter_view_files()]
    per_token = ("drift_tokens", "drift_teacher_tokens", "drift_token_samples", "trained_tokens")
    expected = [v for v in views if v not in ("drift_settings", *per_token)]
    assert "drift_steps" in expected and "audit_tokens" in expected
    assert [name for name, _, _ in ratios] == ["scan", *expected]
    assert ratios[0][2] == 1.0
    assert all(seconds > 0 and ratio > 0 for _, seconds, ratio in ratios)
    bench.print_view_ratios(tmp_path, repeat=1)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["scan", *expected]
    assert all(line.endswith("x the plain scan") for line in lines)


def test_the_dump_size_counts_every_format_s_files(tmp_path):
    """The dump sizes `make bench` prints count the files extraction reads: prime-rl's rank
    files (not its `STABLE` markers or `metrics.jsonl`), NeMo-RL's logs, `.pt` files."""
    from tokenlake.generator.synth import PRESETS, write_dump

    write_dump(tmp_path / "prime", PRESETS["prime-rl"])
    files = sorted(
        p.relative_to(tmp_path / "prime").as_posix() for p in bench._dump_files(tmp_path / "prime")
    )
    assert files == [f"token_exports/step_{s}/rank_{r}.jsonl" for s in (1, 2, 3) for r in (0, 1)]
