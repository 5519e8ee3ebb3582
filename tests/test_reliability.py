"""Bad input and faults a new user meets in the first hour (issue 12): each gives a clear error or is contained,
and nothing is lost. End-to-end checks of the same things are in test_e2e.py."""

import errno
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch.checkpoint import RunError, find_resume, save_checkpoint
from launch.config import check_config, check_model_path, check_wandb_login, compose
from launch.run_dir import RunDirLock
from launch.tracking import json_line
from rewards.compose import RewardComposer
from rl.config import ConfigError
from rl.data import load_domain_rows
from rl.metrics import eval_metrics, rollout_metrics, trainer_metrics
from rl.trajectory import Trajectory
from trainer.objectives import GRPO

ROOT = Path(__file__).resolve().parents[1]


def _traj(uid, group, reward, domain="math", parts=None, failed=False, text="x"):
    t = Trajectory(uid=uid, group_id=group, domain=domain, prompt_ids=[1], response_ids=[2, 3],
                   inference_logprobs=[-1.0, -1.0], response_text=text)
    t.reward, t.reward_parts, t.reward_failed = reward, parts or {}, failed
    return t


# ------------------------------------------------------------------------------------------------ the CLI
def test_score_cli_keeps_every_row_and_may_overwrite_its_input(tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"domains": {"logic": {"rewards": [{"name": "exact_match", "weight": 1.0}]}},
                               "rewards": {"num_workers": 1}, "rollout": {"max_new_tokens": 16}}))
    rows = [{"domain": "logic", "prompt": "q", "response": "Answer: 7 \ud800", "answer": "7"},
            {"domain": "logic", "prompt": "q", "response": "Answer: 7", "answer": "7"},
            {"domain": "logic", "prompt": "q", "response": "\udfff\ud800", "answer": "8"}]
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))  # ASCII JSON with \\ud800 escapes
    proc = subprocess.run([sys.executable, "-m", "launch.score", str(data), "--out", str(data), "--config", str(cfg)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(x) for x in data.read_text(encoding="utf-8").splitlines()]
    assert [r["reward"] for r in out] == [1.0, 1.0, 0.0]  # the input was replaced by the scored rows, none lost
    assert out[0]["response"] == rows[0]["response"]  # the lone surrogate survives the round trip
    assert not list(tmp_path.glob(".in.jsonl*"))  # no temporary file left


def test_json_line_always_encodes():
    line = json_line({"t": "a\ud800b", "u": "é"})
    line.encode("utf-8")
    assert json.loads(line) == {"t": "a\ud800b", "u": "é"}
    assert "é" in json_line({"u": "é"})  # readable when it can be


# -------------------------------------------------------------------------------------------- the run dir
def test_a_run_dir_holds_one_run(tmp_path):
    lock = RunDirLock(tmp_path)
    with pytest.raises(ConfigError, match=r"run_dir=.* is in use by another run \(.*pid"):
        RunDirLock(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "launch.train", "+experiment=mixed_rl", f"run_dir={tmp_path}",
                           "logger.mode=disabled"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "is in use by another run" in proc.stderr + proc.stdout
    assert not (tmp_path / "metrics.jsonl").exists()  # refused before writing anything
    lock.release()
    RunDirLock(tmp_path).release()  # free again


# ------------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("override, match", [
    ("rollout.n_samples=1", r"rollout\.n_samples must be >= 2"),
    ("+trainer.foo=1", r"trainer\.foo: unknown key"),
    ("+logger.colour=red", r"logger\.colour: unknown key"),
    ("+rewards.exact_match.bogus=1", r"rewards\.exact_match\.bogus: unknown key"),
    ("+domains.logic.rewards=[{name: no_such_module.fn}]", r"domains\.logic\.rewards\[0\].*no_such_module"),
    ("eval.n_samples=0", r"eval\.n_samples"),
    ("rollout.max_staleness=2", r"rollout\.max_staleness=2: use 0 .* or 1"),
    ("trainer.pack_sequences=yes", r"trainer\.pack_sequences must be one of"),
    ("trainer.gradient_checkpointing=sometimes", r"trainer\.gradient_checkpointing must be one of"),
    ("trainer.profile_step=-1", r"trainer\.profile_step"),
    ("domains.agent.agent.max_turns=two", r"domains\.agent\.agent: max_turns='two': expected a positive number"),
    ("domains.agent.agent.max_turns=2.5", r"domains\.agent\.agent: max_turns=2\.5"),
    ("domains.agent.agent.thinking=3", r"domains\.agent\.agent: thinking=3: expected true or false"),
    ("domains.agent.agent.tool_workers=0", r"domains\.agent\.agent: tool_workers=0"),
    ("domains.agent.agent.system_prompt=[a]", r"domains\.agent\.agent: system_prompt=\['a'\]: expected a string"),
])
def test_config_mistakes_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        check_config(compose(["+experiment=mixed_rl", override]))


def test_known_keys_pass():
    for override in ("+rewards.exact_match.max_answer_chars=100", "+rewards.math.inner_timeout_s=3",
                     "+rollout.engine_args.enforce_eager=true", "+data.chat_template_kwargs.enable_thinking=false"):
        check_config(compose(["+experiment=mixed_rl", override]))


def test_weight_zero_switches_a_domain_off():
    cfg = compose(["+experiment=mixed_rl", "domains.general.weight=0"])
    check_config(cfg)
    assert set(cfg["domains"]) == {"math", "code", "logic", "agent"}  # the judge is then not needed at all
    with pytest.raises(ConfigError, match="every domain has weight 0"):
        check_config(compose(["+experiment=mixed_rl", *(f"domains.{d}.weight=0" for d in
                                                       ("math", "code", "logic", "general", "agent"))]))


def test_greedy_sampling_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING):
        check_config(compose(["+experiment=mixed_rl", "rollout.temperature=0"]))
    assert "every advantage is 0" in caplog.text


def test_missing_model_path_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"model\.path=/nonexistent/model: not a local model directory") as e:
        check_model_path("/nonexistent/model")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"model\.path=no-such-org/no-such-model"):
        check_model_path("no-such-org/no-such-model")
    check_model_path("embedded:tiny-moe")
    check_model_path(str(tmp_path))  # a local directory is taken as it is


def test_online_wandb_without_a_key_fails_at_start(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.delenv("NETRC", raising=False)
    with pytest.raises(ConfigError, match=r"logger\.mode=online needs a W&B API key"):
        check_wandb_login({"mode": "online"})
    check_wandb_login({"mode": "offline"})
    (tmp_path / ".netrc").write_text("machine api.wandb.ai login user password abc\n")
    os.chmod(tmp_path / ".netrc", 0o600)
    check_wandb_login({"mode": "online"})


def test_bad_dataset_files_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"question": "ok", "answer": "1"}\n{"question": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(ConfigError, match=r"domains\.math\.dataset\.path=.*bad\.jsonl: line 2 is not valid UTF-8"):
        load_domain_rows("math", {"path": str(bad), "columns": {"prompt": "question"}})
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match=r"empty\.jsonl: the file is empty"):
        load_domain_rows("math", {"path": str(empty), "columns": {"prompt": "question"}})


# ----------------------------------------------------------------------------------------------- metrics
def test_every_domain_is_logged_every_step_and_dead_groups_are_counted():
    trajs = [_traj("a", "g1", 1.0, parts={"math": 1.0}), _traj("b", "g1", 0.0, parts={"math": 0.0}),
             _traj("c", "g2", 0.5), _traj("d", "g2", 0.5), _traj("e", "g3", 0.0), _traj("f", "g3", 1.0, failed=True)]
    m = rollout_metrics(trajs, {"math": ["math", "length"], "code": ["code"], "agent": ["env_verifier"]},
                        agent_domains=["agent"])
    assert m["samples/code"] == 0.0 and m["reward/code/mean"] is None and m["reward/code/code"] is None
    assert m["episode/agent/turns"] is None and m["episode/agent/termination/submitted"] is None and m["time/tools"] is None
    t = trainer_metrics([{"seqs/math": 4.0, "opsm_masked/math": 1.0, "tokens": 8.0}], ["math", "code"], 1, GRPO.metrics)
    assert t["opsm/math/masked_frac"] == 0.25 and t["opsm/code/masked_frac"] is None
    assert t["memory/trainer_free_gib"] is None and t["memory/others_gib"] is None  # a CPU trainer reports none
    ranks = [{"gpu_free_gib": 30.0, "gpu_others_gib": 4.0, "gpu_peak_gib": 20.0},
             {"gpu_free_gib": 20.0, "gpu_others_gib": 6.0, "gpu_peak_gib": 30.0}]
    t = trainer_metrics(ranks, ["math"], 1)  # per rank: the mean over ranks
    assert (t["memory/trainer_free_gib"], t["memory/others_gib"], t["memory/trainer_peak_gib"]) == (25.0, 5.0, 25.0)
    assert m["reward/math/mean"] == pytest.approx(3.0 / 6) and m["reward/math/length"] == 0.0
    # g2 (0.5, 0.5) and g3 (one scored sample) carry no signal, g1 does
    assert m["advantage/zero_variance_group_frac"] == pytest.approx(2 / 3)


def test_eval_metrics_mean_and_pass_at_k():
    def t(uid, group, outcome, reward):
        return _traj(uid, group, reward, parts={"math": outcome})

    trajs = [t("a", "p1", 1.0, 1.1), t("b", "p1", 0.0, 0.0), t("c", "p2", 0.0, -0.1), t("d", "p2", 0.0, 0.0)]
    m = eval_metrics(trajs, 2, {"math": "math"}, 1.0)
    assert m["eval/math/pass@k"] == 0.5 and m["eval/math/pass@1"] == 0.25 and m["eval/k"] == 2.0
    assert m["eval/math/mean@k"] == pytest.approx(0.25) and m["eval/math/prompts"] == 2.0
    assert not any("@2" in key for key in m)  # k's value is not in the names: other n_samples, same charts


# ------------------------------------------------------------------------------------------- checkpoints
def _ckpt(root: Path, step: int, optimizer_bytes: int = 64) -> Path:
    p = root / "checkpoints" / f"step_{step:06d}"
    (p / "deepspeed" / "state").mkdir(parents=True)
    (p / "hf").mkdir()
    (p / "deepspeed" / "state" / "optim_states.pt").write_bytes(b"x" * optimizer_bytes)
    (p / "hf" / "model.safetensors").write_bytes(b"w" * 32)
    (p / "state.json").write_text(json.dumps({"step": step, "data": {"cursor": {}}}))
    sizes = {str(f.relative_to(p)): f.stat().st_size for f in p.rglob("*") if f.is_file()}
    (p / "MANIFEST.json").write_text(json.dumps(sizes))
    (p / "COMPLETE").touch()
    return p


def test_damaged_newest_checkpoint_gives_way_to_the_previous(tmp_path, caplog):
    older, newest = _ckpt(tmp_path, 2), _ckpt(tmp_path, 4)
    optim = newest / "deepspeed" / "state" / "optim_states.pt"
    optim.write_bytes(b"x" * 10)  # truncated
    with caplog.at_level(logging.WARNING):
        assert find_resume("auto", tmp_path) == [older]
    assert "step_000004" in caplog.text and "optim_states.pt has 10 bytes, 64 were written" in caplog.text
    with pytest.raises(ConfigError, match=r"trainer\.resume=.*optim_states\.pt has 10 bytes"):
        find_resume(str(newest), tmp_path)
    (older / "state.json").unlink()
    with pytest.raises(ConfigError, match="no checkpoint in .* is whole"):
        find_resume("auto", tmp_path)
    assert "state.json is missing" in caplog.text


class _FullDisk:
    def save(self, path, state):
        Path(path).mkdir(parents=True)
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_during_a_checkpoint_is_one_clear_error(tmp_path):
    with pytest.raises(RunError, match=r"checkpoint step_000003: writing it under .*No space left on device.*GiB free"):
        save_checkpoint(_FullDisk(), {"step": 3, "data": {}}, tmp_path, 3, keep=2)
    assert not list((tmp_path / "checkpoints").iterdir())  # no half checkpoint left behind


# ------------------------------------------------------------------------------------------ custom rewards
DOMAINS = {"chat": {"rewards": [{"name": "custom_reward_example:contains_keyword", "weight": 1.0, "keyword": "blue"},
                                {"name": "custom_reward_example.hangs", "weight": 1.0, "timeout_s": 1.0}]}}


def test_a_reward_given_as_a_dotted_path_runs_with_the_same_policy():
    with RewardComposer(DOMAINS, {"num_workers": 1}, 16) as c:
        a, b = c.score([_traj("a", "g", 0.0, domain="chat", text="the sky is blue"),
                        _traj("b", "g", 0.0, domain="chat", text="grey")])
    assert a.reward_parts["custom_reward_example:contains_keyword"] == 2.5
    assert b.reward_parts["custom_reward_example:contains_keyword"] == -0.5
    assert a.reward_parts["custom_reward_example.hangs"] == 0.0 and "timeout" in a.reward_error and a.reward_failed


# ------------------------------------------------------------------------------------ logit processing
def _tiny(tmp_path, model_type, **extra):
    from rl.models import build_random_model

    spec = dict(model_type=model_type, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                tie_word_embeddings=False, **extra)
    build_random_model(tmp_path, spec)
    return str(tmp_path)


def test_linear_logit_scaling_is_applied_by_the_trainer(tmp_path):
    """Granite divides its logits by logits_scaling after the LM head; the trainer's logprob must match the
    model's own log-softmax (what the engine samples from)."""
    import torch

    from rl.models import load_causal_lm
    from rl.trajectory import collate
    from trainer.forward import forward_logprobs, logit_scale

    model = load_causal_lm(_tiny(tmp_path, "granite", logits_scaling=4.0)).eval()
    assert logit_scale(model) == pytest.approx(0.25, rel=1e-4)
    t = Trajectory(uid="a", group_id="g", domain="d", prompt_ids=[3, 4, 5], response_ids=[6, 7, 8],
                   inference_logprobs=[0.0, 0.0, 0.0])
    batch = collate([t], pad_id=0)
    with torch.no_grad():
        want = torch.log_softmax(model(input_ids=batch.input_ids).logits[0, 2:5].double() / 0.7, -1)
        got = forward_logprobs(model, batch, temperature=0.7 / logit_scale(model)).logprobs
    torch.testing.assert_close(got.double(), want.gather(1, torch.tensor([[6], [7], [8]]))[:, 0], atol=1e-5, rtol=0)


def test_softcapped_logits_are_refused_at_start(tmp_path):
    from launch.config import check_logit_processing

    with pytest.raises(ConfigError, match="final_logit_softcapping=30.0"):
        check_logit_processing(_tiny(tmp_path, "gemma2", final_logit_softcapping=30.0))


def test_eval_without_an_eval_dataset_is_warned_and_off(tiny_moe_path, caplog):
    from launch.sources import held_out_prompts
    from rl.models import load_tokenizer

    cfg = compose(["+experiment=mixed_rl"])
    tok, data = load_tokenizer(tiny_moe_path), dict(max_prompt_tokens=512)
    assert sorted(held_out_prompts(cfg["eval"], cfg["domains"], tok, data).domains) == ["logic", "math"]
    assert held_out_prompts({**cfg["eval"], "every": 0}, cfg["domains"], tok, data) is None
    assert held_out_prompts({**cfg["eval"], "every": 0, "only": True}, cfg["domains"], tok, data) is not None
    for spec in cfg["domains"].values():
        spec.pop("eval_dataset", None)
    with caplog.at_level(logging.WARNING):
        assert held_out_prompts(cfg["eval"], cfg["domains"], tok, data) is None
    assert "no domain has an eval_dataset" in caplog.text
    with pytest.raises(ConfigError, match=r"eval\.only=true: no domain has an eval_dataset"):  # nothing it could do
        held_out_prompts({**cfg["eval"], "only": True}, cfg["domains"], tok, data)


def test_wandb_keeps_the_steps_a_resumed_run_redoes(tmp_path, monkeypatch):
    """The run died at step 5 after a checkpoint at step 3: the resumed run logs steps 4 and 5 again; W&B's own step
    would drop them as lower than 5, so the charts' x-axis is the `step` metric instead."""
    from launch.tracking import Tracker

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = {"logger": {"mode": "offline", "project": "t", "progress_bar": False, "save_rollouts": False}}
    tracker = Tracker(cfg, tmp_path, total_steps=6, start_step=0, resume=False)
    for step in (1, 2, 3, 4, 5, 4, 5):
        tracker.log({"step": step, "reward/mean": 0.1 * step})
    assert tracker.run.step == 7  # seven rows in W&B's history, none dropped
    tracker.close()
