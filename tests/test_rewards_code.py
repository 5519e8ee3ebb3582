"""Code reward and sandbox: scoring modes, hostile programs (each 0 with a reason, in time, no process left),
and validation of every bundled code problem with its reference solution."""

import json
import os
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from rewards.code_reward import split_asserts
from rewards.compose import RewardComposer
from rewards.sandbox import SandboxLimits, run_program
from rl.trajectory import Trajectory

REPO = Path(__file__).resolve().parents[1]
LIMITS = dict(wall_s=3.0, cpu_s=2, memory_mb=512)
ADD_TESTS = {"type": "stdio", "cases": [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5", "output": "10"}]}
DOUBLE_TESTS = {"type": "assert", "code": "assert f(1) == 2\nx = 3\nassert f(x) == 6\nassert f(0) == 1"}


def traj(program, tests, uid="u", fence="python"):
    text = f"<think>plan</think>Here:\n```{fence}\n{program}\n```\n"
    return Trajectory(uid=uid, group_id="g", domain="code", prompt_ids=[1], response_ids=np.zeros(3),
                      inference_logprobs=np.zeros(3), response_text=text, sample={"tests": tests})


def sandbox_leftovers() -> list:
    """Processes still running sandboxed code of THIS checkout (another checkout's test run may be going on):
    guard processes and their forks (they keep the guard's command line, exec is blocked)."""
    guard = str(Path(__file__).resolve().parents[1] / "rewards" / "sandbox_guard.py")
    left = []
    for p in psutil.process_iter(["pid", "cmdline", "uids", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.info["cmdline"] or [])
            if guard in cmd:
                left.append((p.pid, cmd[:80]))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return left


@pytest.fixture(scope="module")
def composer():
    c = RewardComposer({"code": [{"name": "code", "weight": 1.0}], "code_all": [{"name": "code", "mode": "all"}]},
                       {"num_workers": 2, "code": dict(LIMITS, timeout_s=30)}, 1024)
    yield c
    c.close()


def test_fraction_and_all_modes(composer):
    good_add = "a, b = map(int, input().split())\nprint(a + b)"
    half = "def f(x):\n    return 2 * x"  # passes 2 of 3 asserts
    trajs = [traj(good_add, ADD_TESTS, "1"), traj(half, DOUBLE_TESTS, "2"), traj("print(3)", ADD_TESTS, "3"),
             traj(half, [ADD_TESTS, DOUBLE_TESTS], "4")]
    composer.score(trajs)
    assert [t.reward for t in trajs] == pytest.approx([1.0, 2 / 3, 0.5, 2 / 5])
    assert all(t.reward_error is None for t in trajs)
    t_all = traj(half, DOUBLE_TESTS, "5")
    t_all.domain = "code_all"
    composer.score([t_all])
    assert t_all.reward == 0.0


def test_exit_before_asserts_does_not_pass(composer):
    hacks = ["import sys\nsys.exit(0)", "import os\nos._exit(0)", "def f(x):\n    return 2 * x\nraise SystemExit(0)"]
    trajs = composer.score([traj(h, DOUBLE_TESTS, str(i)) for i, h in enumerate(hacks)])
    assert [t.reward for t in trajs] == [0.0, 0.0, 0.0]


def test_no_code_block(composer):
    t = Trajectory(uid="n", group_id="g", domain="code", prompt_ids=[1], response_ids=[1], inference_logprobs=[0.0],
                   response_text="I would just print it.", sample={"tests": ADD_TESTS})
    composer.score([t])
    assert t.reward == 0.0 and "no python code block" in t.reward_error


HOSTILE = {
    "infinite loop": ("while True:\n    pass", ("cpu_limit", "timeout")),
    "sleep forever": ("import time\ntime.sleep(10**6)", ("timeout",)),
    "fork bomb": ("import os\nwhile True:\n    os.fork()", ("forbidden",)),
    "10 GB allocation": ("x = bytearray(10 * 1024**3)\nprint(len(x))", ("memory",)),
    "write /tmp/evil": ("open('/tmp/evil_sandbox_test', 'w').write('x')", ("forbidden",)),
    "write into the repo": (f"open({str(REPO / 'evil_sandbox_test')!r}, 'w').write('x')", ("forbidden",)),
    "relative escape": ("open('../../evil_sandbox_test2', 'w').write('x')", ("forbidden",)),
    "socket": ("import socket\ns = socket.socket()\ns.connect(('1.1.1.1', 80))", ("forbidden",)),
    "subprocess": ("import os\nos.system('echo hi > /tmp/evil_sandbox_test')", ("forbidden",)),
    "output flood": ("while True:\n    print('x' * 10000)", ("output_limit",)),
    "frame peek": ("import sys\nprint(sys._getframe(1).f_locals)", ("forbidden",)),
    "dir_fd write": (("import os\nfd = os.open('/tmp', os.O_RDONLY)\n"
                      "os.close(os.open('evil_sandbox_test3', os.O_CREAT | os.O_WRONLY, dir_fd=fd))"), ("forbidden",)),
    "dir_fd mkdir": ("import os\nfd = os.open('/tmp', os.O_RDONLY)\nos.mkdir('evil_sandbox_test4', dir_fd=fd)",
                     ("forbidden",)),
    "read project data": (f"print(open({str(REPO / 'rl' / 'bundled' / 'code.jsonl')!r}).read())", ("forbidden",)),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_scores_zero_with_reason(composer, name):
    program, statuses = HOSTILE[name]
    t0 = time.monotonic()
    t = composer.score([traj(program, ADD_TESTS, name)])[0]
    elapsed = time.monotonic() - t0
    assert t.reward == 0.0
    assert t.reward_error is not None and any(s in t.reward_error for s in statuses), t.reward_error
    assert elapsed < 2 * (LIMITS["wall_s"] + 2), elapsed  # two stdio cases, each bounded by wall_s
    assert not sandbox_leftovers()
    for path in ("/tmp/evil_sandbox_test", REPO / "evil_sandbox_test", "/tmp/evil_sandbox_test2",
                 "/tmp/evil_sandbox_test3", "/tmp/evil_sandbox_test4"):
        assert not os.path.exists(path)


def test_hostile_response_text(composer):
    big = "x" * 1_000_000
    trajs = [traj("print(3)\n#" + big, ADD_TESTS, "big"), traj("print('\ud800\x00')", ADD_TESTS, "sur"),
             Trajectory(uid="t", group_id="g", domain="code", prompt_ids=[1], response_ids=[1], inference_logprobs=[0.0],
                        response_text="<think>```python\nprint(3)\n```" + "```" * 1000, sample={"tests": ADD_TESTS})]
    composer.score(trajs)
    assert all(t.reward == 0.0 for t in trajs)
    assert not sandbox_leftovers()


def test_program_may_use_its_temp_dir():
    res = run_program("open('f.txt', 'w').write('hi')\nprint(open('f.txt').read())", SandboxLimits(**LIMITS))
    assert res.status == "ok" and res.stdout.strip() == "hi"


@pytest.mark.skipif(os.geteuid() != 0, reason="privilege drop only happens as root")
def test_runs_as_unprivileged_uid_without_network():
    res = run_program("import os\nprint(os.getuid(), os.getgid())\nprint(open('/proc/net/dev').read().count(':'))",
                      SandboxLimits(**LIMITS))
    uid, gid = map(int, res.stdout.split()[:2])
    assert uid != 0 and gid == 65534
    assert int(res.stdout.split()[2]) <= 1  # fresh network namespace: loopback only (when unshare works)


def test_split_asserts_merges_setup():
    snippets, n = split_asserts("x = 1\nassert x == 1\ny = 2\nassert y == 2\nprint('tail')")
    assert n == 2 and snippets[1].startswith("y = 2") and snippets[1].endswith("print('tail')")


def test_bundled_code_problems_pass_with_reference_solutions(composer):
    rows = [json.loads(line) for line in (REPO / "rl/bundled/code.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) >= 30
    kinds = {r["tests"]["type"] for r in rows}
    assert kinds == {"stdio", "assert"}
    trajs = [traj(r["solution"], r["tests"], r["id"]) for r in rows]
    composer.score(trajs)
    bad = [(t.uid, t.reward, t.reward_error) for t in trajs if t.reward != 1.0]
    assert not bad
    # ...and a wrong program fails them
    wrong = composer.score([traj("print('nope')", rows[0]["tests"], "w")])[0]
    assert wrong.reward == 0.0


# ------------------------------------------------------------------------- issue 67: prelude and null inputs
LEETCODE = ("class Solution:\n    def topTwo(self, nums: List[int]) -> Optional[List[int]]:\n"
            "        c = Counter(nums)\n        return [k for k, _ in c.most_common(2)] if nums else None\n"
            "    def dist(self, edges: List[Tuple[int, int]]) -> int:\n        g = defaultdict(list)\n"
            "        for a, b in edges:\n            g[a].append(b)\n        q, seen = deque([0]), {0}\n"
            "        while q:\n            for v in g[heappop([q.popleft()])]:\n"
            "                if v not in seen:\n                    seen.add(v)\n                    q.append(v)\n"
            "        return len(seen)")
LEETCODE_TESTS = {"type": "assert", "code": "s = Solution()\nassert s.topTwo([1, 1, 2, 3, 3, 3]) == [3, 1]\n"
                                            "assert s.topTwo([]) is None\nassert s.dist([(0, 1), (1, 2), (5, 6)]) == 3"}


def test_a_prelude_gives_leetcode_style_solutions_their_names():
    plain = RewardComposer({"code": [{"name": "code"}]}, {"num_workers": 1, "code": LIMITS}, 1024)
    typed = RewardComposer({"code": [{"name": "code", "prelude": "typing"}]}, {"num_workers": 1, "code": LIMITS}, 1024)
    own = RewardComposer({"code": [{"name": "code", "prelude": "from typing import List, Optional, Tuple\n"
                                    "from collections import Counter, defaultdict, deque\nfrom heapq import heappop"}]},
                         {"num_workers": 1, "code": LIMITS}, 1024)
    try:
        (t,) = plain.score([traj(LEETCODE, LEETCODE_TESTS)])
        assert t.reward == 0.0 and t.reward_error is None  # NameError: List (off by default)
        for c in (typed, own):
            (t,) = c.score([traj(LEETCODE, LEETCODE_TESTS)])
            assert (t.reward, t.reward_error) == (1.0, None)
        # stdio programs get it too
        (t,) = typed.score([traj("print(sum(List.__name__ == 'List' for _ in [0]) + 2)", ADD_TESTS)])
        assert t.reward == 0.5  # prints 3: the first case's answer
    finally:
        for c in (plain, typed, own):
            c.close()
    with pytest.raises(ValueError, match="prelude"):
        RewardComposer({"code": [{"name": "code", "prelude": "  "}]}, {"code": LIMITS}, 1024)


@pytest.mark.parametrize("case", [{"input": None, "output": "3"}, {"input": "1 2", "output": None},
                                  {"input": ["1", "2"], "output": "3"}, {"input": True, "output": "3"}, "1 2"])
def test_a_stdio_case_without_string_input_or_output_is_a_data_error(composer, case):
    (t,) = composer.score([traj("print(3)", {"type": "stdio", "cases": [case]})])
    assert t.reward == 0.0 and t.reward_failed and "stdio case 0" in t.reward_error, t.reward_error
    (t,) = composer.score([traj("print(3)", {"type": "stdio", "cases": [{"input": 12, "output": 3}]})])
    assert t.reward == 1.0  # numbers are their text
