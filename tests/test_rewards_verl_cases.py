"""verl's CPU reward test cases, carried over as a table of our own (issue 67).

Each row is (response, truth, expected, note[, verl]): the response text, the reference (a math answer, or a code
sample's `tests`), the score OUR reward must give through its public path (`rewards.compose.RewardComposer`, default
settings of the `math` / `code` rewards), and where the facts come from. `verl` is verl's own expected score when it
is not ours, other than by scale (math_dapo scores a miss -1, verl's GSM8k test pays a wrong answer its format score
0.1; we score both 0: such rows say so in their note); those rows say why. Rows whose note starts with "ours:" are not
verl's: companions (the same answer written as an answer, the same case the other way round, verl's window case moved
to our window's edge) that keep a verl row from passing for the wrong reason.
The facts (input text, reference, verdict) were read in verl-project/verl, `tests/utils/reward_score/` and the pull
requests that add to it: test_sandbox_on_cpu.py and reward_score/test_sandbox_fusion_on_cpu.py (main, 2026-08-22),
test_math_dapo_on_cpu.py (#7440) and the math_dapo boxed fallback (e7b50ea), test_gsm8k_on_cpu.py (#7274),
test_default_compute_score_on_cpu.py (#6156), test_prime_math_grader_on_cpu.py (#7437, and #7500's security cases
for issue 5331), test_numeric_canonicalization_on_cpu.py (#2446), test_prime_code_process_cleanup_on_cpu.py
(#7254); two rows come from the issue's own comparison (`\\boxed{1,000}`, `Answer: \\$18`). A change in math-verify,
in our parsing or in the sandbox that flips one of these verdicts fails here, row by row.

Conventions of ours these rows rest on: the math reward reads the final answer the way math-verify does (in
`\\boxed{}`, in `$...$`, after "answer", or the last number in prose), never a bare LaTeX expression without
delimiters, and scores 0 or 1; the code reward runs the answer's last fenced Python block (verl's completions are
bare programs: each is wrapped in a fence here) and scores the fraction of test units passed.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, NamedTuple

import numpy as np
import pytest

from rewards.compose import RewardComposer
from rl.trajectory import Trajectory


class Row(NamedTuple):
    response: str
    truth: Any  # math: the reference answer; code: the sample's `tests`
    expected: float  # our score
    note: str
    verl: float | None = None  # verl's expected score where it is not ours (beyond its scale: see the docstring)
    prelude: str | None = None  # the code reward's `prelude` for this row (default: none)


# ------------------------------------------------------------------------------------------------------- math
_PAD_CHARS = 300  # verl's GSM8k tail window (_SOLUTION_CLIP_CHARS), which its own window tests straddle
_PAD = ("the reasoning above confirms this result is consistent. " * 80)


def _pad(n: int) -> str:
    """Digit-free filler of n characters (as in verl's GSM8k tests: it can never be read as an answer)."""
    return _PAD[:n]


_LONG = "1234567890123456789"
_MARK = os.path.join(tempfile.gettempdir(), "issue67-verl5331-marker")  # the security payloads try to create these

_OCCURRENCES_TESTS = {"type": "assert", "code": "\n".join([
    "assert Solution().occurrencesOfElement([1, 3, 1, 7], [1, 3, 2, 4], 1) == [0, -1, 2, -1]",
    "assert Solution().occurrencesOfElement([1, 2, 3], [10], 5) == [-1]"])}

MATH_ROWS = [
    # prime math, through verl's default_compute_score (test_sandbox_on_cpu.py::test_prime_math): the whole
    # completion is a bare LaTeX expression, which the prime grader reads whole.
    Row("\\begin{bmatrix}\n -7 & 6 & -8 \\\\\n 11 & -9 & 12 \\\\\n 15 & -16 & 19 \n \\end{bmatrix}",
        "\\begin{pmatrix}\n -7 & 6 & -8 \\\\\n 11 & -9 & 12 \\\\\n 15 & -16 & 19\n \\end{pmatrix}", 0.0,
        "prime math matrix: a bare LaTeX matrix with no $ or \\boxed{} is no final answer for math-verify", verl=1.0),
    Row("\\frac{\\sqrt{505}}{7}", "\\frac{\\sqrt{505}}{7}", 0.0,
        "prime math fraction: bare LaTeX, not read (no delimiters)", verl=1.0),
    Row("x^2 + y^2 + 4x - 6y + 13", "(x + 2)^2 + (y - 3)^2 ", 0.0,
        "prime math symbolic: bare LaTeX with letters is not read (math-verify reads bare numbers only)", verl=1.0),
    # the same three answers written as answers ($$...$$ for the matrix's lines, $...$): the comparison itself agrees
    # with the prime grader
    Row("$$\\begin{bmatrix}\n -7 & 6 & -8 \\\\\n 11 & -9 & 12 \\\\\n 15 & -16 & 19 \n \\end{bmatrix}$$",
        "\\begin{pmatrix}\n -7 & 6 & -8 \\\\\n 11 & -9 & 12 \\\\\n 15 & -16 & 19\n \\end{pmatrix}", 1.0,
        "ours: prime math matrix in $$...$$: bmatrix equals pmatrix"),
    Row("$$\\begin{bmatrix}\n -7 & 6 & -8 \\\\\n 11 & -9 & 12 \\\\\n 15 & -16 & 18 \n \\end{bmatrix}$$",
        "\\begin{pmatrix}\n -7 & 6 & -8 \\\\\n 11 & -9 & 12 \\\\\n 15 & -16 & 19\n \\end{pmatrix}", 0.0,
        "ours: prime math matrix in $$...$$, one entry wrong (the comparison is not vacuous)"),
    Row("$\\frac{\\sqrt{505}}{7}$", "\\frac{\\sqrt{505}}{7}", 1.0, "ours: prime math fraction in $...$"),
    Row("$x^2 + y^2 + 4x - 6y + 13$", "(x + 2)^2 + (y - 3)^2 ", 1.0,
        "ours: prime math symbolic in $...$: expanded equals the completed squares"),
    # prime math grader (test_prime_math_grader_on_cpu.py): helper-level facts, the extracted answer in \boxed{}
    Row("\\boxed{2\\pi}", "6.283185307179586", 1.0, "prime grader handle_pi: 2\\pi is 2*pi"),
    Row("\\boxed{\\pi}", "3.141592653589793", 1.0, "prime grader handle_pi: bare \\pi is pi"),
    Row("\\boxed{3.5\\pi}", "10.995574287564276", 1.0, "prime grader handle_pi: a decimal multiple of pi"),
    Row("\\boxed{[5, 6]}", "\\begin{pmatrix} 5 \\\\ 6 \\end{pmatrix}", 0.0,
        "prime grader bracket matrix: for math-verify [5, 6] is an interval/list, not a column vector", verl=1.0),
    Row("\\boxed{Matrix([[1, 2]])}", "\\begin{pmatrix} 1 & 2 \\end{pmatrix}", 0.0,
        "prime grader Matrix(...) literal: sympy syntax, not LaTeX; we do not evaluate it", verl=1.0),
    Row("\\boxed{x + x}", "2 * x", 1.0, "prime grader symbolic_equal: x + x = 2x"),
    Row("\\boxed{1 / 3}", "0.3333333333333333", 1.0, "prime grader symbolic_equal: 1/3 against its float"),
    # prime grader security cases (verl issue 5331): model text must never run; each scores 0 and creates nothing
    Row(f"\\boxed{{__import__('os').system('touch {_MARK}-1') and 1\\pi}}", "\\pi", 0.0,
        "security: os.system payload before \\pi (handle_pi used to eval it)"),
    Row("\\boxed{[].__class__.__base__.__subclasses__()\\pi}", "\\pi", 0.0,
        "security: __subclasses__ gadget before \\pi"),
    Row(f"\\boxed{{[open('{_MARK}-2','w').write('x')]}}", "\\begin{pmatrix} 5 \\end{pmatrix}", 0.0,
        "security: open().write payload in the bracket-matrix branch"),
    Row(f"\\boxed{{Matrix(open('{_MARK}-3','w').write('x') and [[1,2]] or [[1,2]])}}",
        "\\begin{pmatrix} 1 & 2 \\end{pmatrix}", 0.0,
        "security: payload in a Matrix(...) literal (it used to write the file AND pay 1)"),
    Row(f"__import__('os').system('touch {_MARK}-4')", "1", 0.0, "security: payload as the whole response"),
    Row("[].__class__.__base__.__subclasses__()", "1", 0.0, "security: gadget as the whole response"),
    # math_dapo (test_math_dapo_on_cpu.py, #7440): a 159-character boxed answer is read whole (verl's 100-character
    # window used to cut it); the last box counts; no box is a miss (-1 there, 0 here: our score is 0/1)
    Row("\\boxed{" + "x" * 151 + "}", "x" * 151, 1.0, "math_dapo: 159-character boxed answer, strict mode"),
    Row("lead-in text " + "\\boxed{" + "x" * 151 + "}", "x" * 151, 1.0,
        "ours: math_dapo's 159-character boxed answer with text before it"),
    Row("\\boxed{99} more reasoning \\boxed{42}", "42", 1.0, "math_dapo: the final box is the answer"),
    Row("\\boxed{42} more reasoning \\boxed{99}", "42", 0.0,
        "ours: math_dapo's final-box case the other way round (wrong here)"),
    Row("reasoning only", "42", 0.0, "math_dapo: no box, no answer (verl scores a miss -1)"),
    # math_dapo's boxed fallback (e7b50ea): Minerva "Answer: X" first, \boxed{} when there is none
    Row("Answer: 42", "42", 1.0, "math_dapo Minerva (the fallback commit's rule): 'Answer: X'"),
    Row("so the result is \\boxed{42}", "42", 1.0,
        "math_dapo fallback (the commit's rule): no 'Answer:' line, the box is read"),
    Row("Answer: 41\n\\boxed{42}", "42", 1.0,
        "math_dapo (the commit's rule) prefers 'Answer:' over a box; math-verify prefers the box (ours by design)",
        verl=-1.0),
    # numeric canonicalization (test_numeric_canonicalization_on_cpu.py, #2446): leading zeros and signs
    Row("\\boxed{033}", "33", 1.0, "canonical int: leading zero"),
    Row("\\boxed{+033}", "33", 1.0, "canonical int: plus sign and leading zero"),
    Row("\\boxed{-0}", "0", 1.0, "canonical int: negative zero"),
    Row("\\boxed{000}", "0", 1.0, "canonical int: zeros"),
    # GSM8k (test_gsm8k_on_cpu.py #7274, test_default_compute_score_on_cpu.py #6156). We do not claim the `####`
    # convention: math-verify reads the number after it as the last number in prose, which agrees where nothing
    # readable follows it.
    Row("reasoning #### 42", "42", 1.0, "gsm8k default reward: right"),
    Row("reasoning #### 41", "42", 0.0, "gsm8k default reward: wrong"),
    Row("2 + 40 = 42.\n#### 42\n", "42", 1.0, "gsm8k: '#### 42', nothing after it"),
    Row("2 + 40 = 42.\n#### 42\n" + _pad(_PAD_CHARS), "42", 1.0, "gsm8k: '#### 42' then 300 characters"),
    Row("2 + 40 = 42.\n#### 42\n" + _pad(4000), "42", 1.0,
        "gsm8k: '#### 42' then 4000 characters: the answer stands before our 4000-character window and is "
        "still read whole (issue 67 item 1)"),
    Row("the answer is 42 " + _pad(4000), "42", 1.0, "gsm8k flexible: 'the answer is 42' then 4000 characters"),
    Row(_pad(_PAD_CHARS + 10 - len(_LONG) // 2) + "the answer is " + _LONG, _LONG, 1.0,
        "gsm8k: a 19-digit answer placed by verl's window-straddle test, read whole"),
    Row(_pad(_PAD_CHARS + 10 - len(_LONG) // 2) + "#### " + _LONG, _LONG, 1.0,
        "gsm8k strict: the same with '####'"),
    # the straddle moved to OUR window (default max_answer_chars=4000): its edge falls after the 9th digit
    Row("the answer is " + _LONG + _pad(4000 - 10), _LONG, 1.0,
        "ours: gsm8k straddle at our window edge: the 19 digits are read whole, not '0123456789' (issue 67 item 1)"),
    Row("#### " + _LONG + "\n" + _pad(4000 - 11), _LONG, 1.0,
        "ours: gsm8k strict straddle at our window edge: read whole (issue 67 item 1)"),
    Row("#### 7\nwait, let me redo that.\n#### 42\n", "42", 1.0, "gsm8k: the last '####' counts"),
    Row(_pad(4000) + "#### 7\nwait, let me redo that.\n#### 42\n" + _pad(4000), "42", 1.0,
        "gsm8k: the last '####' counts, 4000 characters on either side"),
    Row("first sentence. second sentence. third sentence.", "42", 0.0, "gsm8k flexible: no number, no answer"),
    Row(_pad(4000), "42", 0.0, "gsm8k: 4000 characters and no number"),
    Row("the answer is 42", "42", 1.0,
        "gsm8k strict wants '####'; we do not claim that convention: 'the answer is 42' is an answer", verl=0.0),
    Row("2 + 40 = 41.\n#### 41\n" + _pad(4000), "42", 0.0,
        "gsm8k: wrong answer (verl pays its format_score, 0.1 in its test; we pay 0)"),
    Row("#### 1,234\n" + _pad(4000), "1234", 1.0, "gsm8k: thousands separator"),
    # from the issue 67 comparison itself
    Row("\\boxed{1,000}", "1000", 1.0, "issue 67: 1,000 is one thousand; ours is right, verl's case is not",
        verl=0.0),
    Row("Answer: \\$18", "18", 1.0, "issue 67 item 2: an escaped dollar in prose hides no answer"),
]

# ------------------------------------------------------------------------------------------------------- code
_KING = """import sys
from collections import deque

def main():
    data = sys.stdin.read().split()
    it = iter(data)
    x0, y0, x1, y1 = int(next(it)), int(next(it)), int(next(it)), int(next(it))
    n = int(next(it))
    allowed = set()
    for _ in range(n):
        r = int(next(it))
        a = int(next(it))
        b = int(next(it))
        for c in range(a, b + 1):
            allowed.add((r, c))
    directions = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]
    start = (x0, y0)
    target = (x1, y1)
    queue = deque()
    queue.append((x0, y0, 0))
    allowed.discard(start)
    while queue:
        x, y, moves = queue.popleft()
        if (x, y) == target:
            print(moves)
            return
        for dx, dy in directions:
            nx, ny = x + dx, y + dy
            if (nx, ny) in allowed:
                allowed.remove((nx, ny))
                queue.append((nx, ny, moves + 1))
    print(-1)

if __name__ == '__main__':
    main()
"""
_KING_IN = ["5 7 6 11\n3\n5 3 8\n6 7 11\n5 2 5\n", "3 4 3 10\n3\n3 1 4\n4 5 9\n3 10 10\n",
            "1 1 2 10\n2\n1 1 3\n2 6 10\n",
            "9 8 7 8\n9\n10 6 6\n10 6 6\n7 7 8\n9 5 6\n8 9 9\n9 5 5\n9 8 8\n8 5 6\n9 10 10\n",
            "6 15 7 15\n9\n6 15 15\n7 14 14\n6 15 15\n9 14 14\n7 14 16\n6 15 15\n6 15 15\n7 14 14\n8 15 15\n",
            "13 16 20 10\n18\n13 16 16\n20 10 10\n19 10 10\n12 15 15\n20 10 10\n18 11 11\n19 10 10\n19 10 10\n"
            "20 10 10\n19 10 10\n20 10 10\n20 10 10\n19 10 10\n18 11 11\n13 16 16\n12 15 15\n19 10 10\n19 10 10\n",
            "89 29 88 30\n16\n87 31 31\n14 95 95\n98 88 89\n96 88 88\n14 97 97\n13 97 98\n100 88 88\n88 32 32\n"
            "99 88 89\n90 29 29\n87 31 31\n15 94 96\n89 29 29\n88 32 32\n97 89 89\n88 29 30\n",
            "30 14 39 19\n31\n35 7 11\n37 11 12\n32 13 13\n37 5 6\n46 13 13\n37 14 14\n31 13 13\n43 13 19\n"
            "45 15 19\n46 13 13\n32 17 17\n41 14 19\n30 14 14\n43 13 17\n34 16 18\n44 11 19\n38 13 13\n40 12 20\n"
            "37 16 18\n46 16 18\n34 10 14\n36 9 10\n36 15 19\n38 15 19\n42 13 19\n33 14 15\n35 15 19\n33 17 18\n"
            "39 12 20\n36 5 7\n45 12 12\n",
            "2 1 1 1\n2\n1 1 2\n2 1 2\n",
            "1 1 1 2\n5\n1000000000 1 10000\n19920401 1188 5566\n1000000000 1 10000\n1 1 10000\n5 100 200\n",
            "1 1 1000000000 2\n5\n1000000000 1 10000\n19920401 1188 5566\n1000000000 1 10000\n1 1 10000\n5 100 200\n"]
_KING_OUT = ["4\n", "6\n", "-1\n", "2\n", "1\n", "-1\n", "1\n", "9\n", "1\n", "1\n", "-1\n"]
_KING_OUT_ONE_WRONG = _KING_OUT[:3] + ["-1\n"] + _KING_OUT[4:]  # verl's "failed sample": its 4th output is wrong

_ECHO_STDIN = """
import sys
data = sys.stdin.read()
if data == 'input1':
    print('output1\\n', end='')
elif data == 'input2':
    print('output2\\n', end='')
else:
    print('unexpected input', end='')
"""
_OCCURRENCES = """
class Solution:
    def occurrencesOfElement(self, nums: List[int], queries: List[int], x: int) -> List[int]:
        positions = defaultdict(list)
        for idx, num in enumerate(nums):
            positions[num].append(idx)

        x_positions = positions[x]
        answer = []
        for k in queries:
            if k > len(x_positions):
                answer.append(-1)
            else:
                answer.append(x_positions[k-1])
        return answer
"""
_MERGE_INTERVALS = """
from typing import List, Tuple

def merge_intervals(intervals: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    if not intervals:
        return []
    intervals.sort(key=lambda x: x[0])
    merged = [intervals[0]]
    for current in intervals[1:]:
        last = merged[-1]
        if current[0] <= last[1]:
            merged[-1] = (last[0], max(last[1], current[1]))
        else:
            merged.append(current)
    return merged
"""


def _fenced(program: str) -> str:
    return f"```python\n{program.strip()}\n```"


def _stdio(inputs, outputs) -> dict:
    return {"type": "stdio", "cases": [{"input": i, "output": o} for i, o in zip(inputs, outputs)]}


CODE_ROWS = [
    # prime code, stdin/stdout (test_sandbox_on_cpu.py::test_prime_code)
    Row(_fenced(_KING), _stdio(_KING_IN, _KING_OUT), 1.0, "prime code: king's BFS, all 11 cases right"),
    Row(_fenced(_KING), _stdio(_KING_IN, _KING_OUT_ONE_WRONG), 10 / 11,
        "prime code: one expected output wrong; our score is the fraction passed, 10/11 (verl's continuous "
        "score counts the cases before the first failure: 0.9 in its test)", verl=0.9),
    Row(_fenced(_KING), _stdio(_KING_IN[:1], _KING_OUT[:1]), 1.0, "prime code apps_check_correctness: first case"),
    # sandbox-fusion wrapper (reward_score/test_sandbox_fusion_on_cpu.py): the programs, run by our sandbox
    Row(_fenced(_ECHO_STDIN), _stdio(["input1", "input2"], ["output1\n", "output2\n"]), 1.0,
        "sandbox fusion: right output for both inputs"),
    Row(_fenced("print('wrong_output\\n', end='')"), _stdio(["input1", "input2"], ["output1\n", "output2\n"]), 0.0,
        "sandbox fusion: wrong output"),
    Row(_fenced("a=b"), _stdio(["input1", "input2"], ["output1\n", "output2\n"]), 0.0,
        "sandbox fusion: compile error (a C++ program there; in Python a NameError)"),
    Row(_fenced('import sys\nprint("About to raise error", file=sys.stderr)\nraise ValueError("This is a runtime '
                'error")'), _stdio(["input1"], ["output1\n"]), 0.0, "sandbox fusion: runtime error"),
    Row(_fenced("import sys\nprint(f\"You said '{sys.stdin.readline().strip()}'\")"),
        _stdio(["", "hello"], ["You said ''", "You said 'hello'"]), 1.0,
        "sandbox fusion: empty stdin is passed as empty (verl's None input is our missing input)"),
    Row(_fenced(_MERGE_INTERVALS), {"type": "assert", "code": "\n".join([
        "assert merge_intervals([(0, 1), (3, 5), (4, 7), (6, 8), (10, 12), (12, 14)]) == [(0, 1), (3, 8), (10, 14)]",
        "assert merge_intervals([(1, 2), (2, 3), (3, 4)]) == [(1, 4)]",
        "assert merge_intervals([(1, 2), (3, 4), (5, 6)]) == [(1, 2), (3, 4), (5, 5)]"])}, 2 / 3,
        "sandbox fusion assert_case: 2 of 3 asserts hold (the 3rd is wrong on purpose)"),
    Row(_fenced(_OCCURRENCES), _OCCURRENCES_TESTS, 1.0,
        "sandbox fusion fn_name call, List/defaultdict used without import (LeetCode style), with the code "
        "reward's `prelude: typing`", prelude="typing"),
    Row(_fenced(_OCCURRENCES), _OCCURRENCES_TESTS, 0.0,
        "ours: the same without a prelude (off by default): NameError on List, a plain zero"),
    # prime code worker cleanup (#7254): a call-based sample
    Row(_fenced("def solve(x):\n    return x"), {"type": "assert", "code": "assert solve(1) == 1"}, 1.0,
        "prime code call-based: solve(1) == 1"),
]


def _traj(i: int, domain: str, text: str, sample: dict) -> Trajectory:
    return Trajectory(uid=f"{domain}{i}", group_id="g", domain=domain, prompt_ids=[1], response_ids=np.zeros(5),
                      inference_logprobs=np.zeros(5), response_text=text, sample=sample)


def _markers() -> list[str]:
    return [f"{_MARK}-{i}" for i in range(1, 5)]


@pytest.fixture(scope="module")
def math_scores():
    for m in _markers():
        if os.path.exists(m):
            os.remove(m)
    with RewardComposer({"math": [{"name": "math", "weight": 1.0}]}, {"num_workers": 1}, 1024) as c:
        out = c.score([_traj(i, "math", r.response, {"answer": r.truth}) for i, r in enumerate(MATH_ROWS)])
    return [(t.reward, t.reward_error) for t in out]


@pytest.fixture(scope="module")
def code_scores():
    domains = {"code": [{"name": "code", "weight": 1.0}], "code_typing": [{"name": "code", "prelude": "typing"}]}
    with RewardComposer(domains, {"num_workers": 2}, 1024) as c:
        out = c.score([_traj(i, "code_typing" if r.prelude == "typing" else "code", r.response, {"tests": r.truth})
                       for i, r in enumerate(CODE_ROWS)])
    return [(t.reward, t.reward_error) for t in out]


def _id(row: Row) -> str:
    ours = row.note.startswith("ours: ")
    note = row.note[6:] if ours else row.note
    return ("ours-" if ours else "") + note.split(":")[0][:40].replace(" ", "_") + "|" + note[-12:].replace(" ", "_")


@pytest.mark.parametrize("i", range(len(MATH_ROWS)), ids=[f"{i}-{_id(r)}" for i, r in enumerate(MATH_ROWS)])
def test_math_row(math_scores, i):
    row = MATH_ROWS[i]
    score, error = math_scores[i]
    assert score == pytest.approx(row.expected), (row.note, row.response[:200], row.truth, score, error)


@pytest.mark.parametrize("i", range(len(CODE_ROWS)), ids=[f"{i}-{_id(r)}" for i, r in enumerate(CODE_ROWS)])
def test_code_row(code_scores, i):
    row = CODE_ROWS[i]
    score, error = code_scores[i]
    assert score == pytest.approx(row.expected), (row.note, score, error)


def test_security_payloads_ran_nothing(math_scores):
    assert [m for m in _markers() if os.path.exists(m)] == []


def test_table_counts():
    """The table's own bookkeeping: verl's score is given only where it is not ours; of the rows carried over from
    verl (the others' notes start with "ours:"), most agree."""
    rows = [r for r in MATH_ROWS + CODE_ROWS if not r.note.startswith("ours:")]
    differ = [r for r in rows if r.verl is not None]
    assert all(r.verl != pytest.approx(r.expected) for r in MATH_ROWS + CODE_ROWS if r.verl is not None)
    assert not [r for r in MATH_ROWS + CODE_ROWS if r.note.startswith("ours:") and r.verl is not None]
    assert (len(rows), len(differ)) == (54, 9)  # update when rows are added: the report counts them
