"""Composition: weights, config errors, a raising part, a hanging part (killed, run goes on), worker wrapper."""

import logging
import threading
import time

import numpy as np
import psutil
import pytest

from rewards import registry
from rewards.compose import RewardComposer
from rewards.spec import RewardSpec
from rewards.worker import RewardWorker
from rl.trajectory import Trajectory


def _hang(view, params):  # module-level: pickled by reference into the pool worker
    while True:
        pass


def _boom(view, params):
    raise RuntimeError("boom")


def _nan(view, params):
    return float("nan")


@pytest.fixture
def extra_rewards(monkeypatch):
    monkeypatch.setitem(registry.REWARDS, "hang", RewardSpec(_hang, runner="pool"))
    monkeypatch.setitem(registry.REWARDS, "boom", RewardSpec(_boom))
    monkeypatch.setitem(registry.REWARDS, "nan", RewardSpec(_nan))


def traj(text, domain="logic", sample=None, n=10, finish="stop", uid="u"):
    return Trajectory(uid=uid, group_id="g", domain=domain, prompt_ids=[1], response_ids=np.zeros(n),
                      inference_logprobs=np.zeros(n), finish_reason=finish, response_text=text,
                      sample=sample if sample is not None else {"answer": "42"})


def test_weighted_sum_and_unweighted_parts():
    c = RewardComposer({"logic": [{"name": "exact_match", "weight": 1.0},
                                  {"name": "format", "weight": 0.2, "thinking": True},
                                  {"name": "length", "weight": 0.5, "mode": "overlong", "buffer": 100}]},
                       {}, max_new_tokens=1000)
    t = c.score([traj("<think>x</think>Answer: 42", n=950)])[0]
    assert t.reward_parts == {"exact_match": 1.0, "format": 1.0, "length": pytest.approx(-0.5)}
    assert t.reward == pytest.approx(1.0 + 0.2 - 0.25)
    assert t.reward_error is None
    c.close()


@pytest.mark.parametrize("domains,msg", [
    ({"logic": [{"name": "nope"}]}, "domains.logic.rewards[0]: unknown reward 'nope'"),
    ({"logic": [{"name": "exact_match"}, {"name": "format", "thinking": "yes"}]}, "domains.logic.rewards[1]: parameter 'thinking'"),
    ({"logic": [{"name": "format", "colour": 1}]}, "domains.logic.rewards[0]: unknown parameter"),
    ({"logic": [{"name": "length", "mode": "overlong"}]}, "domains.logic.rewards[0]: mode 'overlong' needs 'buffer'"),
    ({"logic": [{"name": "length", "mode": "linear", "target": 10}]}, "needs 'target'"),
    ({"logic": [{"name": "char_fraction"}]}, "parameter 'chars' is required"),
    ({"logic": [{"name": "code", "mode": "most"}]}, "must be one of"),
    ({"logic": [{"name": "exact_match", "weight": "big"}]}, "'weight' must be a finite number"),
    ({"logic": [{"name": "format"}, {"name": "format"}]}, "distinct 'label'"),
    ({"logic": [{"name": "rubric_judge"}]}, "needs a judge"),
    ({"logic": []}, "domains.logic.rewards: must be a non-empty list"),
])
def test_config_errors_name_the_part(domains, msg):
    with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        RewardComposer(domains, {}, 100)


def test_domain_block_form_and_rewards_section_defaults():
    c = RewardComposer({"code": {"kl_coef": 0.0, "rewards": [{"name": "code"}]}},
                       {"code": {"wall_s": 2.5, "mode": "all", "parallel": 1}}, 10)
    p = c.domains["code"][0].params
    assert p["wall_s"] == 2.5 and p["mode"] == "all"
    c.close()


def test_raising_and_invalid_parts_zero_with_reason(extra_rewards):
    c = RewardComposer({"logic": [{"name": "exact_match", "weight": 1.0}, {"name": "boom", "weight": 5.0},
                                  {"name": "nan", "weight": 1.0}]}, {}, 10)
    t = c.score([traj("Answer: 42")])[0]
    assert t.reward == 1.0
    assert t.reward_parts == {"exact_match": 1.0, "boom": 0.0, "nan": 0.0}
    assert "boom: RuntimeError: boom" in t.reward_error and "nan: returned nan" in t.reward_error
    c.close()


def test_hanging_part_is_killed_and_run_continues(extra_rewards):
    c = RewardComposer({"logic": [{"name": "exact_match", "weight": 1.0}, {"name": "hang", "timeout_s": 1.5}]},
                       {"num_workers": 2}, 10)
    workers = set(c._pool.worker_pids())
    t0 = time.monotonic()
    out = c.score([traj("Answer: 42", uid="a"), traj("Answer: 41", uid="b")])
    assert time.monotonic() - t0 < 15
    assert [t.reward for t in out] == [1.0, 0.0]
    assert all(t.reward_error == "hang: timeout" for t in out)
    time.sleep(0.2)
    alive = [p for p in workers if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, "the hung workers must be killed"
    # the pool came back and still works
    assert c.score([traj("Answer: 42", uid="c")])[0].reward_parts["exact_match"] == 1.0
    c.close()


def test_isolated_flag_runs_inline_reward_in_pool():
    c = RewardComposer({"logic": [{"name": "exact_match", "isolated": True}]}, {"num_workers": 1}, 10)
    assert c.domains["logic"][0].runner == "pool"
    assert c.score([traj("Answer: 42")])[0].reward == 1.0
    c.close()


def test_unknown_domain_and_missing_fields():
    c = RewardComposer({"logic": [{"name": "exact_match"}, {"name": "format", "thinking": False}]}, {}, 10)
    a, b = c.score([traj("x", domain="poetry"), traj("Answer: 1", sample={})])
    assert a.reward == 0.0 and "unknown domain 'poetry'" in a.reward_error
    assert b.reward == 0.0 and "missing 'answer'" in b.reward_error and b.reward_parts["format"] == 0.0
    c.close()


def test_reward_worker_from_resolved_config():
    cfg = {"domains": {"logic": {"rewards": [{"name": "exact_match", "weight": 2.0}]}},
           "rewards": {"timeout_s": 5}, "rollout": {"max_new_tokens": 64}}
    w = RewardWorker(cfg)
    assert w.ready()
    assert w.score([traj("Answer: 42")])[0].reward == 2.0
    w.close()


def test_reward_worker_accepts_omegaconf():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"domains": {"logic": {"rewards": [{"name": "length", "mode": "overlong", "buffer": 8}]}},
                            "rewards": {}, "rollout": {"max_new_tokens": 16}})
    w = RewardWorker(cfg)
    assert w.score([traj("x", n=16)])[0].reward == -1.0
    w.close()


CALLS: list[str] = []


def _counting(view, params):
    CALLS.append(view.response)
    return 1.0 if "42" in view.response else 0.0


def _said(text, group="g", uid="u", finish="stop"):
    """A sample whose response ids follow its text, as a decoded sample's do."""
    t = traj(text, uid=uid, finish=finish)
    t.response_ids, t.group_id = np.frombuffer(text.encode(), np.uint8).astype(np.int32), group
    return t


def test_prescored_samples_are_not_scored_again_unless_their_response_changed(monkeypatch):
    """RewardWorker.prescore (samples that ended while the rollout still generates) -> score takes those results for
    samples of the same group with the same response and end, whichever sample of the group they are, and runs the
    reward only for the rest."""
    monkeypatch.setitem(registry.REWARDS, "counting", RewardSpec(_counting))
    CALLS.clear()
    w = RewardWorker({"domains": {"logic": {"rewards": [{"name": "counting", "weight": 2.0}]}}, "rewards": {},
                      "rollout": {"max_new_tokens": 64}})
    assert w.prescore([_said("Answer: 42", uid="early"), _said("Answer: 7", uid="early")]) == 2
    assert w.early_stats()["kept"] == 2 and len(CALLS) == 2  # early_stats waits for the scoring thread
    share = [_said("Answer: 42", uid="a"), _said("Answer: 42", uid="b"),  # the same response twice: both served
             _said("Answer: 7", uid="c", finish="length"),  # ended otherwise than the one scored early
             _said("Answer: 42", group="h", uid="d")]  # another group
    out = w.score(share)
    assert [t.reward for t in out] == [2.0, 2.0, 0.0, 2.0] and out[0].reward_parts == {"counting": 1.0}
    assert len(CALLS) == 4  # "a" and "b" came from prescore; "c" and "d" ran now
    assert w.early_stats() == {"scored": 4, "used": 2, "kept": 0}  # the group's unused result went with it
    CALLS.clear()
    assert w.score([_said("Answer: 42", uid="a")])[0].reward == 2.0 and len(CALLS) == 1  # a group is served once
    w.close()


def test_prescore_leaves_judge_domains_to_score():
    class CountingJudge:  # anything with score(requests) is a judge to the composer
        def __init__(self):
            self.calls = 0

        def score(self, requests):
            self.calls += 1
            return [{"score": 1.0} for _ in requests]

    judge = CountingJudge()
    w = RewardWorker({"domains": {"general": {"rewards": [{"name": "rubric_judge", "weight": 1.0}]}}, "rewards": {},
                      "rollout": {"max_new_tokens": 64}}, judge=judge)
    sample = {"rubric": "Says hello."}
    assert w.prescore([traj("hello", domain="general", sample=sample, uid="a")]) == 0
    assert judge.calls == 0 and w.early_stats()["kept"] == 0
    w.close()


GATE = threading.Event()


def _gated(view, params):
    """Holds the scoring thread on a "slow" response until GATE is set."""
    if "slow" in view.response:
        assert GATE.wait(30)
    CALLS.append(view.response)
    return 1.0 if "42" in view.response else 0.0


def _wait_until(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_prescore_returns_at_once_and_the_thread_scores_what_queued_meanwhile_in_one_call(monkeypatch):
    """prescore only queues: the actor is free for the next call while a batch is scored, and the batches that
    arrived meanwhile go to the composer together."""
    monkeypatch.setitem(registry.REWARDS, "gated", RewardSpec(_gated))
    CALLS.clear()
    GATE.clear()
    w = RewardWorker({"domains": {"logic": {"rewards": [{"name": "gated", "weight": 1.0}]}}, "rewards": {},
                      "rollout": {"max_new_tokens": 64}})
    batches = []
    real_score = w.composer.score
    monkeypatch.setattr(w.composer, "score", lambda trajs: batches.append(len(trajs)) or real_score(trajs))
    assert w.prescore([_said("slow 42", group="g1")]) == 1
    _wait_until(lambda: w._busy)  # the thread took it and waits on the gate
    assert w.prescore([_said("Answer: 42", group="g2", uid="a"), _said("Answer: 7", group="g2", uid="b")]) == 2
    assert w.prescore([_said("Answer: 42", group="g3")]) == 1
    # all three calls returned while the first batch is held at the gate (a prescore that scored in the call would
    # wait there): nothing is scored yet
    assert CALLS == []
    GATE.set()
    assert w.early_stats()["kept"] == 4
    assert batches == [1, 3]  # the first batch, then the two that queued behind it at once
    out = w.score([_said("Answer: 42", group="g2", uid="a"), _said("Answer: 7", group="g2", uid="b")])
    assert [t.reward for t in out] == [1.0, 0.0] and batches == [1, 3]  # taken from the early results
    w.close()


def test_score_takes_its_groups_queued_samples_with_the_rest(monkeypatch):
    """A share's samples still queued for the thread when `score` comes are scored once, in either call, with the
    rewards a plain scoring gives; other groups' queued samples stay queued."""
    monkeypatch.setitem(registry.REWARDS, "gated", RewardSpec(_gated))
    CALLS.clear()
    GATE.clear()
    w = RewardWorker({"domains": {"logic": {"rewards": [{"name": "gated", "weight": 2.0}]}}, "rewards": {},
                      "rollout": {"max_new_tokens": 64}})
    w.prescore([_said("slow", group="g0")])  # holds the thread
    _wait_until(lambda: w._busy)
    w.prescore([_said("Answer: 42", group="g1", uid="a"), _said("Answer: 1", group="other", uid="z")])
    share = [_said("Answer: 42", group="g1", uid="a"), _said("Answer: 7", group="g1", uid="b")]
    done = []
    caller = threading.Thread(target=lambda: done.append(w.score(share)))
    caller.start()
    time.sleep(0.2)
    assert not done  # waits for the batch in progress
    GATE.set()
    caller.join(30)
    assert [t.reward for t in done[0]] == [2.0, 0.0]
    stats = w.early_stats()  # once the thread is done too
    assert sorted(CALLS) == sorted(["slow", "Answer: 42", "Answer: 7", "Answer: 1"])  # each sample scored once
    thread_first = CALLS.index("Answer: 1") < CALLS.index("Answer: 7")  # it took g1's queued sample before `score`
    assert stats == {"scored": 2, "used": int(thread_first), "kept": 2}  # g0's and other's results stay
    w.close()


def test_zeros_with_a_reason_warn_once_per_part(caplog):
    """A part's zeros with a reason (an answer in the wrong format: expected, not a failure) are a warning the first
    time and INFO after: samples scored during generation come in many small batches per step."""
    c = RewardComposer({"math": [{"name": "math"}]}, {"num_workers": 1}, 10)
    with caplog.at_level(logging.INFO, logger="rewards.compose"):
        for _ in range(3):
            t = c.score([traj("I do not know.", domain="math")])[0]
            assert t.reward == 0.0 and t.reward_error and not t.reward_failed
    lines = [r for r in caplog.records if "scored 0 with a reason" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.INFO, logging.INFO]
    c.close()


# ------------------------------------------------------------------ sample text in the run's log (item 5)
# A reason that quotes a program's stderr or the submission must not forge lines of train.log (a fake "step 99 reward
# 1.000" line), erase console lines (ESC[2K) or flood it: one record, one line, escapes visible, bounded.
STDERR = ("runtime_error: Traceback (most recent call last):\nstep 99 reward 1.000\n\rstep 100 reward 1.000"
          "\x1b[2K\x1b[1A\u2028step 101 reward 1.000\x85done")


def _stderr_zero(view, params):
    from rewards.spec import RewardZero

    raise RewardZero(STDERR)  # an expected zero whose reason is what the program printed


def _stderr_fail(view, params):
    raise RuntimeError(f"sandbox setup failed: {STDERR}")  # a failed part, its message from stderr


def _huge_reason(view, params):
    from rewards.spec import RewardZero

    raise RewardZero("x\n" * 50_000)


class _RaisingJudge:
    def score(self, requests):
        raise RuntimeError(STDERR)


class RunLog(logging.Handler):
    """The run's own log handler (launch/worker_logs.py) on the given loggers, writing to a string; also counts the
    records it wrote."""

    def __init__(self, logger_names=("rewards.compose",)):
        import io

        from launch.worker_logs import run_log_handler

        super().__init__(logging.INFO)
        self.stream = io.StringIO()
        self.inner, self.records = run_log_handler(self.stream), 0
        self.loggers = [logging.getLogger(n) for n in logger_names]

    def emit(self, record):
        self.records += 1
        self.inner.emit(record)

    def text(self) -> str:
        return self.stream.getvalue()

    def __enter__(self) -> "RunLog":
        self.levels = [lg.level for lg in self.loggers]
        for lg in self.loggers:
            lg.addHandler(self)
            lg.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc) -> None:
        for lg, level in zip(self.loggers, self.levels):
            lg.removeHandler(self)
            lg.setLevel(level)


def assert_one_line_each(text: str, records: int, forged=("step 99", "step 100", "step 101")):
    """`records` log records wrote exactly `records` lines (as any reader splits lines, \\r, \\u2028, \\x85
    included), no line starts with a forged entry, and the escapes are visible."""
    lines = text.splitlines()
    assert len(lines) == records, lines
    assert not any(line.lstrip().startswith(forged) for line in lines)
    assert "\x1b" not in text and "\r" not in text


def test_reward_reasons_from_a_sample_are_logged_as_one_escaped_line(monkeypatch):
    monkeypatch.setitem(registry.REWARDS, "stderr_zero", RewardSpec(_stderr_zero))
    monkeypatch.setitem(registry.REWARDS, "stderr_fail", RewardSpec(_stderr_fail))
    monkeypatch.setitem(registry.REWARDS, "huge_reason", RewardSpec(_huge_reason))
    domains = {"code": [{"name": "stderr_zero"}, {"name": "stderr_fail"}, {"name": "huge_reason"}],
               "agent": [{"name": "env_verifier"}], "general": [{"name": "rubric_judge"}]}
    verifier_zero = traj("done", domain="agent", uid="v0")  # the verifier's reason quotes the submission
    verifier_zero.episode = {"outcome": {"score": 0.0, "reason": f"submitted {STDERR!s}"}}
    verifier_error = traj("done", domain="agent", uid="v1")  # the verifier raised over the submission
    verifier_error.episode = {"outcome": {"score": 0.0, "error": f"ValueError: {STDERR}"}}
    judged = traj("Blue.", domain="general", uid="j0", sample={"prompt": "q", "rubric": [{"criterion": "c"}]})
    unknown = traj("x", domain="agent\nstep 99 reward 1.000", uid="u0")
    with RunLog() as log, RewardComposer(domains, {}, 16, judge=_RaisingJudge()) as c:
        trajs = c.score([traj("print(1)", domain="code", uid="c0"), verifier_zero, verifier_error, judged, unknown])
        text = log.text()
    assert log.records == 8
    # records: the unknown domain, the judge call's failure, then per sample the failed parts (code, verifier,
    # judge), and one "scored 0 with a reason" per part with expected zeros (stderr_zero, huge_reason, env_verifier)
    assert_one_line_each(text, 8)
    assert text.count("\\nstep 99 reward 1.000\\n\\rstep 100 reward 1.000\\x1b[2K") >= 5
    assert "\\u2028step 101" in text and "\\x85done" in text
    assert max(len(line) for line in text.splitlines()) < 1000  # the 100 000-character reason is bounded
    # the stored reason stays the text itself (rollouts/*.jsonl escapes it as JSON; people read it there)
    assert "\nstep 99 reward 1.000\n\r" in trajs[0].reward_error and STDERR in trajs[1].reward_error


def test_log_safe_escapes_every_line_break_and_control_and_bounds_the_length():
    from rewards.text import log_safe

    assert log_safe("plain text, café 中文 \\boxed{1}") == "plain text, café 中文 \\boxed{1}"  # unchanged
    out = log_safe(STDERR + "\x0b\x0c\x1c\x1d\x1e\u2029\u202e\x00\ud800\t")
    assert len(out.splitlines()) == 1 and out.isprintable()
    for shown in ("\\n", "\\r", "\\x1b[2K", "\\u2028", "\\x85", "\\x0b", "\\u2029", "\\u202e", "\\x00", "\\ud800",
                  "\\t"):
        assert shown in out
    out = log_safe("\n" * 10_000, 200)
    assert len(out) <= 200 and out.endswith("(10000 characters)") and out.startswith("\\n\\n")
    assert len(log_safe("x" * 10**6)) <= 300
    try:
        raise ValueError("bad turn\nstep 99 reward 1.000")
    except ValueError as exc:
        out = log_safe(exc, 1000)
    assert out.startswith("ValueError: bad turn\\nstep 99") and "test_rewards_compose.py" in out
    assert len(out.splitlines()) == 1
    assert log_safe(b"a\nb") == "a\\nb" and log_safe(None) == "None"


def test_an_early_scoring_failure_is_logged_as_one_escaped_line(monkeypatch):
    """The reward worker's scoring thread logs an error that escaped the composer (it may quote a sample) on one
    line, where it was raised included; the samples are scored again with their share."""
    w = RewardWorker({"domains": {"logic": {"rewards": [{"name": "exact_match", "weight": 1.0}]}}, "rewards": {},
                      "rollout": {"max_new_tokens": 64}})
    real_score = w.composer.score

    def broken(trajs):
        raise RuntimeError(f"bad sample {STDERR}")

    monkeypatch.setattr(w.composer, "score", broken)
    with RunLog(("rewards.worker",)) as log:
        assert w.prescore([_said("Answer: 42")]) == 1
        assert w.early_stats()["kept"] == 0
    assert log.records == 1
    assert_one_line_each(log.text(), 1)
    assert "bad sample runtime_error" in log.text() and "test_rewards_compose.py" in log.text()
    monkeypatch.setattr(w.composer, "score", real_score)
    assert w.score([_said("Answer: 42")])[0].reward == 1.0
    w.close()
