"""Loop pieces that need no cluster: advantages with failed rewards, resume selection, start-up checks."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from launch.checkpoint import find_resume
from rl.advantages import assign_advantages, attach_domain_coefficients
from rl.config import ConfigError
from rl.trajectory import Trajectory, collate

ROOT = Path(__file__).resolve().parents[1]


def _traj(uid, group, reward, failed=False, **kw):
    t = Trajectory(uid=uid, group_id=group, domain="math", prompt_ids=[1, 2], response_ids=[3, 4],
                   inference_logprobs=[-1.0, -1.0], **kw)
    t.reward, t.reward_failed = reward, failed
    return t


def test_failed_rewards_get_no_advantage_and_no_say_in_the_baseline():
    cfg = {"algorithm": {"normalize_adv_std": False}, "domains": {"math": {"kl_coef": 0.1}}}
    trajs = [_traj("a", "g", 1.0), _traj("b", "g", 0.0), _traj("c", "g", 0.0, failed=True), _traj("d", "h", 0.5)]
    assign_advantages(trajs, cfg["algorithm"]["normalize_adv_std"])
    attach_domain_coefficients(trajs, cfg["domains"])
    assert [t.advantage for t in trajs] == [0.5, -0.5, 0.0, 0.0]  # group g's mean is over a and b only
    assert all(t.kl_coef == 0.1 and t.opsm_delta is None for t in trajs)  # opsm_delta absent = off


def _checkpoint(root: Path, step: int) -> Path:
    p = root / "checkpoints" / f"step_{step:06d}"
    p.mkdir(parents=True)
    (p / "state.json").write_text(json.dumps({"step": step, "data": {"cursor": {}}}))
    (p / "deepspeed").mkdir()
    (p / "hf").mkdir()
    (p / "COMPLETE").touch()
    return p


def test_resume_selection(tmp_path):
    assert find_resume(None, tmp_path) == [] and find_resume("auto", tmp_path) == []
    older = _checkpoint(tmp_path, 2)
    newest = _checkpoint(tmp_path, 10)
    (tmp_path / "checkpoints" / "step_000012").mkdir()  # a save that never completed
    assert find_resume("auto", tmp_path) == [newest, older]  # newest first, older ones as fallbacks
    with pytest.raises(ConfigError, match=r"trainer\.resume.*already has checkpoints"):
        find_resume(None, tmp_path)  # a fresh run must not overwrite (and later resume into) another run
    with pytest.raises(ConfigError, match=r"trainer\.resume=.*not a complete checkpoint"):
        find_resume(str(tmp_path / "checkpoints" / "step_000012"), tmp_path)


def test_collate_rejects_mixed_masks_and_trajectory_checks_csr():
    masked = _traj("a", "g", 0.0, kept_ids=np.array([3, 7, 4], dtype=np.int32), kept_offsets=np.array([0, 2, 3]))
    with pytest.raises(ValueError, match="kept set"):
        collate([masked, _traj("b", "g", 0.0)], pad_id=0)
    with pytest.raises(ValueError, match="kept_offsets"):
        _traj("c", "g", 0.0, kept_ids=np.array([3, 4], dtype=np.int32), kept_offsets=np.array([0, 2, 3]))
    with pytest.raises(ValueError, match="loss_mask"):
        _traj("d", "g", 0.0, loss_mask=np.array([1]))


def test_an_empty_response_joins_a_batch_with_kept_sets_and_routes():
    """An agent episode whose first prompt did not fit its window has no response and so nothing to replay."""
    routes = np.arange(3 * 2 * 1).reshape(3, 2, 1)  # P + R - 1 rows, 2 layers, top-1
    full = _traj("a", "g", 1.0, kept_ids=np.array([3, 7, 4], dtype=np.int32), kept_offsets=np.array([0, 2, 3]),
                 routed_experts=routes)
    empty = Trajectory(uid="b", group_id="g", domain="math", prompt_ids=[1, 2, 5], response_ids=[],
                       inference_logprobs=[])
    batch = collate([full, empty], pad_id=0)
    assert batch.kept_offsets.tolist() == [0, 2, 3] and batch.targets.tolist() == [3, 4]
    assert batch.route_valid.tolist() == [[True, True, True], [False, False, False]]
    with pytest.raises(ValueError, match="routed_experts"):
        collate([full, _traj("c", "g", 0.0, kept_ids=np.array([3, 4], dtype=np.int32),
                             kept_offsets=np.array([0, 1, 2]))], pad_id=0)


@pytest.mark.parametrize(
    "override, key",
    [
        ("domains.math.rewards=[{name: maths, weight: 1.0}]", r"domains\.math\.rewards\[0\].*unknown reward"),
        ("rollout.engine=vlm", r"rollout\.engine"),
        ("trainer.resume=/nonexistent/ckpt", r"trainer\.resume"),
    ],
)
def test_cli_start_up_errors(override, key, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "launch.train", "+experiment=mixed_rl", override, "logger.mode=disabled",
         f"run_dir={tmp_path / 'run'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]


def test_checkpoints_every_n_steps_and_after_the_last_unless_told_not_to():
    from launch.loop import checkpoint_due

    due = lambda **t: [s for s in range(1, 8) if checkpoint_due(s, 7, {"save_every": 3, **t})]  # noqa: E731
    assert due() == [3, 6, 7]
    assert due(save_last=False) == [3, 6]  # trainer.save_last=false: a benchmark of a large model skips the last
    assert [s for s in range(1, 8) if checkpoint_due(s, 7, {"save_every": 0})] == [7]

