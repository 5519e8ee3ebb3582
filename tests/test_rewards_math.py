"""Math reward through the composer's killable process pool: equivalences, wrong answers, hostile input."""

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

from rewards.compose import RewardComposer
from rewards.math_reward import math_verify_reward
from rewards.spec import RewardZero, SampleView
from rl.trajectory import Trajectory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# sympy needs far more than 1 s to compare this with 5 (math-verify's own comparison timeout then fires).
SLOW = "\\boxed{2^{2^{2^{2^{2^{22}}}}} - 3^{3^{3^{3^{33}}}}}"
# The LaTeX parser needs minutes for this one (math-verify's own parsing timeout fires).
SLOW_PARSE = "$\\boxed{" + "(" * 300 + "1" + ")" * 300 + "}$"


def traj(text, answer, domain="math", n=5, uid="u"):
    return Trajectory(uid=uid, group_id="g", domain=domain, prompt_ids=[1], response_ids=np.zeros(n),
                      inference_logprobs=np.zeros(n), response_text=text, sample={"answer": answer})


@pytest.fixture(scope="module")
def composer():
    c = RewardComposer({"math": [{"name": "math", "weight": 1.0}]},
                       {"num_workers": 2, "math": {"timeout_s": 10, "memory_mb": 4096}}, 1024)
    yield c
    c.close()


EQUIVALENT = [
    ("The answer is \\boxed{0.5}", "1/2"),
    ("<think>...</think>\\boxed{\\frac{1}{2}}", "0.5"),
    ("so the result is 1/2", "\\frac{1}{2}"),
    ("\\boxed{[1,3)}", "[1,3)"),
    ("\\boxed{(0, \\infty)}", "(0,\\infty)"),
    ("\\boxed{\\{3,2,1\\}}", "\\{1,2,3\\}"),
    ("\\boxed{3, 1, 2}", "1,2,3"),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\sqrt{2}/2"),
    ("\\boxed{(x+1)^2}", "x^2+2x+1"),
    ("Final answer: $0.75$", "3/4"),
]
WRONG = [
    ("\\boxed{0.4}", "1/2"),
    ("\\boxed{[1,3]}", "[1,3)"),
    ("\\boxed{\\{1,2\\}}", "\\{1,2,3\\}"),
    ("\\boxed{3}", "-3"),
    ("<think>the answer is \\boxed{5}", "5"),  # never left the reasoning: no answer part
]


def test_equivalences_score_one(composer):
    trajs = composer.score([traj(t, a, uid=str(i)) for i, (t, a) in enumerate(EQUIVALENT)])
    assert [t.reward for t in trajs] == [1.0] * len(EQUIVALENT), [(t.response_text, t.reward_error) for t in trajs]
    assert all(t.reward_error is None for t in trajs)


def test_wrong_answers_score_zero(composer):
    trajs = composer.score([traj(t, a, uid=str(i)) for i, (t, a) in enumerate(WRONG)])
    assert [t.reward for t in trajs] == [0.0] * len(WRONG)
    assert trajs[-1].reward_error == "math: empty answer part"


def test_hostile_inputs(composer):
    hostile = ["x" * 1_000_000 + " \\boxed{1/2}", "\ud800\x00\x07 \\boxed{1/2}", "<think></think><think>\\boxed{1/2}",
               "\\boxed{" * 5000, "\\boxed{9^{9^{9^{9^{9}}}}}", "$" * 100000]
    t0 = time.monotonic()
    trajs = composer.score([traj(h, "1/2", uid=str(i)) for i, h in enumerate(hostile)])
    assert time.monotonic() - t0 < 60
    assert trajs[0].reward == 1.0 and trajs[1].reward == 1.0
    for t in trajs:
        assert t.reward in (0.0, 1.0)
        assert t.reward == 1.0 or t.reward_error is not None or t.reward_parts["math"] == 0.0


def test_stuck_sample_times_out_and_pool_recovers():
    c = RewardComposer({"math": [{"name": "math", "timeout_s": 1.0}]}, {"num_workers": 1}, 1024)
    try:
        before = set(c._pool.worker_pids())
        # A power tower sympy cannot evaluate in time: math-verify's inner timeout is larger than the outer one.
        c.domains["math"][0].params["inner_timeout_s"] = 60
        t0 = time.monotonic()
        out = c.score([traj("\\boxed{2^{2^{2^{2^{2^{22}}}}} - 3^{3^{3^{3^{33}}}}}", "5", uid="slow"),
                       traj("\\boxed{0.5}", "1/2", uid="fine")])
        assert time.monotonic() - t0 < 30
        assert out[1].reward == 1.0
        if out[0].reward_error == "math: timeout":  # sympy gave up quickly on some builds; then nothing to check
            assert c._pool.restarts >= 1
            assert not (before & set(c._pool.worker_pids()))
            assert not [p for p in before if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    finally:
        c.close()


@pytest.mark.parametrize("text,reason", [(SLOW, "math-verify timed out comparing with the reference"),
                                         (SLOW_PARSE, "math-verify timed out parsing the answer")],
                         ids=["comparison", "parsing"])
def test_inner_timeout_is_the_reason(text, reason):
    """math-verify only logs its own timeouts and returns False / []: the sample still scores 0, now with why.

    In a fresh interpreter, as in the reward pool's processes where this reward runs: math-verify's timeout is a
    SIGALRM handler in the main thread, and after the rest of the suite has run in this process (Ray, threads,
    subprocesses) its alarm was seen not to interrupt the parse at all (CI runs of this session)."""
    code = textwrap.dedent(f"""
        from rewards.math_reward import math_verify_reward
        from rewards.spec import RewardZero, SampleView
        view = SampleView(response={text!r}, answer={text!r}, sample={{"answer": "5"}}, finish_reason="stop",
                          num_response_tokens=5, domain="math", max_new_tokens=1024)
        try:
            print("SCORE", math_verify_reward(view, {{"max_answer_chars": 4000, "inner_timeout_s": 1}}))
        except RewardZero as exc:
            print("ZERO", exc)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search("ZERO " + reason, proc.stdout), proc.stdout[-2000:]


# A fresh process: its forkserver and pool workers write to the stderr captured here.
SCORE_SLOW = textwrap.dedent("""
    import json, numpy as np
    from rewards.compose import RewardComposer
    from rl.trajectory import Trajectory
    c = RewardComposer({"math": [{"name": "math", "inner_timeout_s": 1}]},
                       {"num_workers": 1, "math": {"timeout_s": 30}}, 1024)
    trajs = [Trajectory(uid=str(i), group_id="g", domain="math", prompt_ids=[1], response_ids=np.zeros(5),
                        inference_logprobs=np.zeros(5), response_text=text, sample={"answer": ans})
             for i, (text, ans) in enumerate(%r)]
    out = c.score(trajs)
    c.close()
    print(json.dumps([[t.reward, t.reward_error, t.reward_failed] for t in out]))
""") % [(SLOW, "5"), ("\\boxed{0.5}", "1/2"), (SLOW_PARSE, "5")]


def test_pool_workers_keep_math_verify_noise_off_the_console():
    proc = subprocess.run([sys.executable, "-c", SCORE_SLOW], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    slow, fine, slow_parse = json.loads(proc.stdout.strip().splitlines()[-1])
    assert fine[0] == 1.0
    # Still an ordinary 0 (not a failure), as before, but with the reason; and no raw "Timeout during ..." line.
    assert slow == [0.0, "math: math-verify timed out comparing with the reference (inner_timeout_s=1)", False]
    assert slow_parse == [0.0, "math: math-verify timed out parsing the answer (inner_timeout_s=1)", False]
    assert "Timeout during" not in proc.stderr + proc.stdout, proc.stderr


# ------------------------------------------------------------------ in-process shortcut for plain-number answers
def _view(text, answer):
    from rewards.text import answer_part

    return SampleView(response=text, answer=answer_part(text), sample={"answer": answer}, finish_reason="stop",
                      num_response_tokens=5, domain="math", max_new_tokens=1024)


def _slow_score(view, params):
    try:
        return math_verify_reward(view, params)
    except RewardZero:
        return 0.0


def _agrees_with_math_verify(decided_cases, undecided_cases, generated, params) -> int:
    """Every answer the shortcut decides gets math-verify's score; `decided_cases` are all decided and
    `undecided_cases` none. Returns how many were decided."""
    from rewards.math_reward import fast_math_check

    decided = 0
    for text, gold in decided_cases + undecided_cases + generated:
        view = _view(text, gold)
        fast = fast_math_check(view, params)
        if fast is not None:
            decided += 1
            assert fast == _slow_score(view, params), (text, gold, fast)
    for text, gold in decided_cases:
        assert fast_math_check(_view(text, gold), params) is not None, (text, gold)
    for text, gold in undecided_cases:
        assert fast_math_check(_view(text, gold), params) is None, (text, gold)
    return decided


PLAIN = [  # (response, reference): every one is decided by the shortcut
    ("\\boxed{42}", "42"), ("\\boxed{41}", "42"), ("\\boxed{-3}", "3"), ("\\boxed{3}", "-3"), ("\\boxed{007}", "7"),
    ("\\boxed{2.50}", "2.5"), ("\\boxed{0.5}", "1/2"), ("\\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{\\dfrac{3}{4}}", "0.75"),
    ("\\boxed{-\\frac{1}{2}}", "-1/2"), ("\\boxed{1000000000001}", "1000000000000"), ("$\\boxed{ 12 }$", "12"),
    ("<think>maybe \\boxed{5}</think> so \\boxed{6}", "6"), ("\\boxed{+5}", "5"), ("\\boxed{.5}", "1/2"),
    ("So 69 + 24 = 93. \\boxed{93}", "93"), ("\\boxed{2.5}", "2.4"), ("\\boxed{0.5}", "1/3"),
    ("The answer is 57.", "57"), ("The answer is 57.", "58"), ("57", "57"), ("I think it is -5!", "-5"),
    ("The answer is \\frac{13}{8}.", "13/8"), ("The answer is \\frac{26}{16}.", "\\frac{13}{8}"),
    ("The answer is \\frac{13}{9}.", "13/8"), ("It is -\\frac{3}{4} meters", "-3/4"), ("\\frac{-3}{4}", "-0.75"),
    ("Answer: \\frac{3}{4}", "-3/4"), ("so \\frac{10}{5}!", "2"),
    ("Answer: 12", "12"), ("The sum is 57, I am sure.", "57"), ("There are 4 apples", "9/2"), ("答案是 7", "7"), ("so it is 7", "7"),
]
UNDECIDED = [  # left to math-verify: tolerance, several boxes, non-numbers, no box
    ("\\boxed{0.333}", "1/3"), ("\\boxed{1} or \\boxed{2}", "2"), ("\\boxed{x+1}", "2"),
    ("\\boxed{1,000}", "1000"), ("\\boxed{50\\%}", "50"), ("\\boxed{3}", "\\sqrt{9}"), ("\\fbox{3} \\boxed{3}", "3"),
    ("\\boxed{3.}", "3"), ("\\boxed{1/0}", "1"), ("", "3"),
    ("\\boxed{5}. The final answer is 6. I hope it is correct.", "6"), ("The final answer is 6", "6"),
    ("The answer is 57 - 3", "54"), ("x = 57", "57"), ("The answer is 57%", "57"), ("**57**", "57"),
    ("The answer is 57.5", "57.5"), ("The answer is 1,000", "1000"), ("pre-5", "-5"), ("$57$", "57"),
    ("The answer is 57th", "57"), ("(57)", "57"),
    ("The answer is \\dfrac{13}{8}.", "13/8"), ("The answer is - \\frac{3}{4}.", "-3/4"),
    ("\\frac{1}{2} and \\frac{1}{3}", "1/2"), ("The answer is \\frac{1}{2} + 1", "3/2"), ("It is \\frac{1}{0}", "1"),
    ("In 3 steps: \\frac{1}{2}", "1/2"), ("$\\frac{1}{2}$", "1/2"), ("pre-\\frac{1}{2}", "-1/2"),
]


def test_fast_path_decides_plain_numbers_exactly_as_math_verify():
    params = {"max_answer_chars": 4000, "inner_timeout_s": 5}
    rng = np.random.default_rng(0)
    generated = []
    for _ in range(150):  # random integers, decimals and fractions, right and wrong, in every written form
        a, b = int(rng.integers(-50, 50)), int(rng.integers(1, 12))
        gold = rng.choice([str(a), f"{a}/{b}", f"{a / b:.3f}".rstrip("0").rstrip(".") if a % b == 0 else f"{a}/{b}"])
        c = a + int(rng.integers(-1, 2)) * int(rng.integers(0, 2))
        pred = rng.choice([str(c), f"{c}/{b}", f"\\frac{{{c}}}{{{b}}}", f"{c * 2}/{b * 2}"])
        generated.append((f"the result is \\boxed{{{pred}}}.", str(gold)))
        generated.append((f"The answer is {c}.", str(gold)))
        generated.append((rng.choice([f"So it is \\frac{{{c}}}{{{b}}}.", f"Answer: -\\frac{{{abs(c)}}}{{{b}}}",
                                      f"\\frac{{{c * 3}}}{{{b * 3}}} in total", f"it is - \\frac{{{c}}}{{{b}}}",
                                      f"\\dfrac{{{c}}}{{{b}}}", f"we get \\frac{{{c}}}{{{b}}} or {c}"]), str(gold)))
        generated.append((f"\\boxed{{{rng.choice([a * 100, a / 100, a / b + 1e-4, a / b + 0.01])}}}", str(gold)))
    assert _agrees_with_math_verify(PLAIN, UNDECIDED, generated, params) >= len(PLAIN) + len(generated) // 3


INTERVALS = [  # (response, reference): decided by the shortcut
    ("\\boxed{[4, 8]}", "[4, 8]"), ("\\boxed{[4,8]}", "[4, 8]"), ("\\boxed{[4, 9]}", "[4, 8]"),
    ("\\boxed{(1, 3]}", "(1, 3]"), ("\\boxed{(1, 4]}", "(1, 3]"), ("\\boxed{-1}", "[4, 8]"),
    ("The answer is -1.", "[3, 12]"), ("\\boxed{[4.0, 8]}", "[4, 8]"), ("so $x$ is in \\boxed{[-2, 5)}.", "[-2, 5)"),
]
INTERVALS_UNDECIDED = [  # left to math-verify
    ("The answer is [1, 7].", "[1, 7]"), ("\\boxed{(4, 8)}", "[4, 8]"), ("\\boxed{[4, 8.5]}", "[4, 8]"),
    ("\\boxed{[1, 2] \\cup [3, 4]}", "[1, 2]"), ("\\boxed{[4, 8]} or \\boxed{[4, 9]}", "[4, 8]"),
    ("\\boxed{x}", "[4, 8]"), ("\\boxed{[5, 5]}", "[5, 5]"),
]


def test_fast_path_decides_intervals_exactly_as_math_verify():
    params = {"max_answer_chars": 4000, "inner_timeout_s": 5}
    rng = np.random.default_rng(1)
    generated = []
    for _ in range(60):  # random intervals, right and wrong ends, every bracket pair, boxed and in prose
        a = int(rng.integers(-9, 9))
        b = a + int(rng.integers(1, 9))
        left, right = rng.choice(["[", "("]), rng.choice(["]", ")"])
        gold = f"{left}{a}, {b}{right}"
        c, d = a + int(rng.integers(-1, 2)), b + int(rng.integers(-1, 2))
        pl, pr = (left, right) if rng.random() < 0.7 else (rng.choice(["[", "("]), rng.choice(["]", ")"]))
        pred = f"{pl}{c}, {d}{pr}" if c < d else f"{pl}{a}, {b}{pr}"
        generated += [(f"Thus \\boxed{{{pred}}}", gold), (f"The answer is {c}.", gold), (f"\\boxed{{{d}}}", gold)]
    decided = _agrees_with_math_verify(INTERVALS, INTERVALS_UNDECIDED, generated, params)
    assert decided >= len(INTERVALS) + len(generated) // 2


def test_plain_answers_never_reach_the_pool(composer, monkeypatch):
    sent = []
    real_run = composer._pool.run

    def counting_run(tasks):
        sent.extend(tasks)
        return real_run(tasks)

    monkeypatch.setattr(composer._pool, "run", counting_run)
    cases = [("\\boxed{12}", "12"), ("\\boxed{13}", "12"), ("\\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{0.333}", "1/3")]
    trajs = composer.score([traj(t, a, uid=str(i)) for i, (t, a) in enumerate(cases)])
    assert [t.reward for t in trajs] == [1.0, 0.0, 1.0, 0.0]
    assert len(sent) == 1  # only the 0.333-vs-1/3 sample needed math-verify
