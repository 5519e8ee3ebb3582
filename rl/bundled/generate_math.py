"""Regenerates `math.jsonl` (training) and `eval/math.jsonl` (held-out: other seed, no question seen in training):
small arithmetic and algebra word problems with exact answers (seeded).

Run `python rl/bundled/generate_math.py` from the repo root. Answers use forms math-verify understands
(integers, fractions, decimals), so the math reward can check equivalent forms.
"""

import json
import random
from fractions import Fraction
from pathlib import Path


def problems(rng: random.Random):
    for _ in range(60):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        yield f"What is {a} + {b}?", str(a + b)
    for _ in range(50):
        a, b = rng.randint(2, 30), rng.randint(2, 30)
        yield f"Compute {a} \\times {b}.", str(a * b)
    for _ in range(50):
        a, b, c = rng.randint(2, 12), rng.randint(1, 40), rng.randint(1, 12)
        x = c
        yield f"Solve for $x$: ${a}x + {b} = {a * x + b}$.", str(x)
    for _ in range(40):
        a, b = rng.randint(1, 9), rng.randint(2, 9)
        c, d = rng.randint(1, 9), rng.randint(2, 9)
        s = Fraction(a, b) + Fraction(c, d)
        yield f"Add the fractions $\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}}$ and simplify.", (
            f"\\frac{{{s.numerator}}}{{{s.denominator}}}" if s.denominator != 1 else str(s.numerator)
        )
    for _ in range(40):
        n = rng.randint(3, 12)
        yield f"A bag has {n} red and {n + 2} blue marbles. What fraction of the marbles are red?", (
            f"\\frac{{{Fraction(n, 2 * n + 2).numerator}}}{{{Fraction(n, 2 * n + 2).denominator}}}"
        )
    for _ in range(40):
        p, q = rng.randint(1, 5), rng.randint(6, 12)
        yield f"Give the interval of real $x$ with ${p} \\le x \\le {q}$ in interval notation.", f"[{p}, {q}]"
    for _ in range(20):
        a = rng.randint(2, 9)
        yield f"What are the solutions of $x^2 = {a * a}$? Give the set of solutions.", f"\\{{-{a}, {a}\\}}"


if __name__ == "__main__":
    train = list(problems(random.Random(20261121)))
    out = Path(__file__).with_name("math.jsonl")
    with out.open("w") as f:
        for i, (q, a) in enumerate(train):
            f.write(json.dumps({"id": f"math-{i:04d}", "question": q, "answer": a}) + "\n")
    seen = {q for q, _ in train}
    held_out = [(q, a) for q, a in dict(problems(random.Random(20261123))).items() if q not in seen]
    random.Random(0).shuffle(held_out)  # every kind of problem among the first rows
    out_eval = Path(__file__).parent / "eval" / "math.jsonl"
    with out_eval.open("w") as f:
        for i, (q, a) in enumerate(held_out[:64]):
            f.write(json.dumps({"id": f"math-eval-{i:03d}", "question": q, "answer": a}) + "\n")
    print(f"wrote {out} and {out_eval}")
