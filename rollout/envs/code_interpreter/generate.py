"""Regenerates the data files (`files/sales.csv`, `files/weather.csv`) and `tasks.jsonl` (20 computational
questions with numeric or short answers), seeded.

Run `python -m rollout.envs.code_interpreter.generate` from the repo root. The answers are computed here, in
plain trusted Python written independently of the reference cells; the reference cells run in the sandbox through
the REPL when `check_env` replays them, so the two ways must agree. Nothing is written unless check_env passes.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
import shutil
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 7321
REGIONS = ["North", "South", "East", "West"]
PRODUCTS = {"Widget": (2.5, 6.0), "Gadget": (10.0, 18.0), "Gizmo": (4.0, 9.0), "Doohickey": (20.0, 35.0),
            "Sprocket": (0.8, 2.2)}
CITIES = {"Aldenport": (3, 19, 60), "Brisca": (-2, 24, 45), "Corvale": (1, 27, 30), "Dunmere": (6, 22, 80),
          "Galtria": (-8, 16, 95)}  # winter low, summer high, mean monthly rain


def sales_rows(rng: random.Random) -> list[dict]:
    rows = []
    for k in range(1, 81):
        product = rng.choice(list(PRODUCTS))
        lo, hi = PRODUCTS[product]
        rows.append({"order_id": k, "date": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                     "region": rng.choice(REGIONS), "product": product, "units": rng.randint(1, 40),
                     "unit_price": f"{rng.uniform(lo, hi):.2f}"})
    return rows


def weather_rows(rng: random.Random) -> list[dict]:
    rows = []
    for city, (low, high, rain) in CITIES.items():
        for month in range(1, 13):
            season = (1 - math.cos((month - 1) / 12 * 2 * math.pi)) / 2  # 0 in January, 1 in July
            temp = low + (high - low) * season + rng.uniform(-1.5, 1.5)
            rows.append({"city": city, "month": month, "temp_c": f"{temp:.1f}",
                         "rain_mm": f"{max(0.0, rng.gauss(rain, rain / 3)):.1f}"})
    return rows


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def primes_below(n: int) -> list[int]:
    return [p for p in range(2, n) if all(p % q for q in range(2, math.isqrt(p) + 1))]


LOAD_SALES = "import csv\nsales = list(csv.DictReader(open('sales.csv')))\nlen(sales)"
LOAD_WEATHER = "import csv\nweather = list(csv.DictReader(open('weather.csv')))\nlen(weather)"


def make_tasks(sales: list[dict], weather: list[dict]) -> list[dict]:
    def fib(n):
        a, b = 0, 1
        for _ in range(n):
            a, b = b, a + b
        return a

    def collatz_len(n):
        steps = 1
        while n != 1:
            n = n // 2 if n % 2 == 0 else 3 * n + 1
            steps += 1
        return steps

    revenue = lambda r: r["units"] * float(r["unit_price"])  # noqa: E731
    by_month, units_by_product = defaultdict(float), Counter()
    for r in sales:
        by_month[int(r["date"][5:7])] += revenue(r)
        units_by_product[r["product"]] += r["units"]
    gizmo = [float(r["unit_price"]) for r in sales if r["product"] == "Gizmo"]
    temps = defaultdict(list)
    for r in weather:
        temps[r["city"]].append(float(r["temp_c"]))
    summer_rain = sum(float(r["rain_mm"]) for r in weather if r["city"] == "Dunmere" and r["month"] in (6, 7, 8))
    x = [(i + 0.5) / 200000 for i in range(200000)]
    matrix = [[2, -1, 0, 3], [1, 4, -2, 0], [0, 5, 1, -1], [3, 0, 2, 2]]

    def det(m):
        if len(m) == 1:
            return m[0][0]
        return sum((-1) ** j * m[0][j] * det([row[:j] + row[j + 1:] for row in m[1:]]) for j in range(len(m)))

    T = []  # (prompt, answer, type, tolerance, reference cells)
    T.append(("What is the 30th Fibonacci number (F(1) = F(2) = 1) modulo 1000?", fib(30) % 1000, "int", 0,
              ["a, b = 0, 1\nfor _ in range(30):\n    a, b = b, a + b\na % 1000"]))
    T.append(("What is the sum of all primes below 10000?", sum(primes_below(10000)), "int", 0,
              ["import numpy as np\nsieve = np.ones(10000, bool)\nsieve[:2] = False\nfor p in range(2, 100):\n"
               "    if sieve[p]:\n        sieve[p*p::p] = False", "int(np.nonzero(sieve)[0].sum())"]))
    T.append(("How many trailing zeros does 1000! (1000 factorial) have?",
              sum(1000 // 5 ** k for k in range(1, 6)), "int", 0,
              ["import math\ns = str(math.factorial(1000))\nlen(s) - len(s.rstrip('0'))"]))
    T.append(("Which starting number below 10000 produces the longest Collatz sequence?",
              max(range(1, 10000), key=collatz_len), "int", 0,
              ["def steps(n):\n    k = 1\n    while n != 1:\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n"
               "        k += 1\n    return k", "max(range(1, 10000), key=steps)"]))
    T.append(("What is the sum of the decimal digits of 2**100?", sum(map(int, str(2 ** 100))), "int", 0,
              ["sum(int(d) for d in str(2 ** 100))"]))
    T.append(("How many integer points (x, y) satisfy x^2 + y^2 <= 2500?",
              sum(1 for a in range(-50, 51) for b in range(-50, 51) if a * a + b * b <= 2500), "int", 0,
              ["sum(1 for x in range(-50, 51) for y in range(-50, 51) if x*x + y*y <= 2500)"]))
    T.append(("What is the least common multiple of the integers 1 to 20?", math.lcm(*range(1, 21)), "int", 0,
              ["import math\nfrom functools import reduce\nreduce(lambda a, b: a * b // math.gcd(a, b), range(1, 21))"]))
    T.append(("What is the 1000th prime number?", primes_below(8000)[999], "int", 0,
              ["primes = []\nn = 2\nwhile len(primes) < 1000:\n    if all(n % p for p in primes if p * p <= n):\n"
               "        primes.append(n)\n    n += 1", "primes[-1]"]))
    T.append(("How many palindromic numbers below 100000 are divisible by 7?",
              sum(1 for n in range(1, 100000) if str(n) == str(n)[::-1] and n % 7 == 0), "int", 0,
              ["len([n for n in range(1, 100000) if str(n) == str(n)[::-1] and n % 7 == 0])"]))
    T.append(("Compute the integral of sin(x^2) for x from 0 to 1, to 6 decimal places.",
              round(sum(math.sin(t * t) for t in x) / len(x), 6), "float", 2e-6,
              ["import numpy as np\nxs = np.linspace(0, 1, 100001)\nys = np.sin(xs ** 2)\n"
               "h = xs[1] - xs[0]\nround(float(h / 3 * (ys[0] + ys[-1] + 4 * ys[1:-1:2].sum() + 2 * ys[2:-1:2].sum())), 6)"]))
    xyz = (2, -1, 3)  # the solution; the right-hand sides are made from it
    rhs = [sum(c * v for c, v in zip(row, xyz)) for row in ([2, 1, -1], [1, -3, 2], [3, 2, 1])]
    T.append((f"Solve the system 2x + y - z = {rhs[0]}, x - 3y + 2z = {rhs[1]}, 3x + 2y + z = {rhs[2]}. "
              "What is x + 2y + 3z?", xyz[0] + 2 * xyz[1] + 3 * xyz[2], "float", 1e-6,
              ["import numpy as np\nsol = np.linalg.solve([[2, 1, -1], [1, -3, 2], [3, 2, 1]], " + str(rhs) + ")\n"
               "round(float(sol @ [1, 2, 3]), 6)"]))
    T.append(("What is the determinant of the matrix [[2, -1, 0, 3], [1, 4, -2, 0], [0, 5, 1, -1], [3, 0, 2, 2]]?",
              det(matrix), "int", 0,
              ["import numpy as np\nround(float(np.linalg.det(np.array(" + json.dumps(matrix) + ", float))))"]))
    T.append(("sales.csv lists orders (units and unit_price per order). What is the total revenue (units times "
              "unit_price) of the North region, rounded to 2 decimals?",
              round(sum(revenue(r) for r in sales if r["region"] == "North"), 2), "float", 0.01,
              [LOAD_SALES, "round(sum(int(r['units']) * float(r['unit_price']) for r in sales "
               "if r['region'] == 'North'), 2)"]))
    T.append(("In sales.csv, which product sold the most units in total?", units_by_product.most_common(1)[0][0],
              "str", 0, [LOAD_SALES, "from collections import Counter\nc = Counter()\nfor r in sales:\n"
                         "    c[r['product']] += int(r['units'])\nprint(c.most_common(1)[0][0])"]))
    T.append(("In sales.csv, in which month of 2024 (1-12) was the total revenue (units times unit_price) highest?",
              max(by_month, key=by_month.get), "int", 0,
              [LOAD_SALES, "from collections import defaultdict\nm = defaultdict(float)\nfor r in sales:\n"
               "    m[int(r['date'][5:7])] += int(r['units']) * float(r['unit_price'])\nmax(m, key=m.get)"]))
    T.append(("In sales.csv, what is the average unit_price of the Gizmo orders, rounded to 2 decimals?",
              round(sum(gizmo) / len(gizmo), 2), "float", 0.01,
              [LOAD_SALES, "g = [float(r['unit_price']) for r in sales if r['product'] == 'Gizmo']\n"
               "round(sum(g) / len(g), 2)"]))
    T.append(("In sales.csv, how many orders have more than 25 units?", sum(r["units"] > 25 for r in sales), "int", 0,
              [LOAD_SALES, "sum(1 for r in sales if int(r['units']) > 25)"]))
    T.append(("weather.csv has monthly mean temperatures per city. Which city has the largest difference between "
              "its warmest and its coldest month?", max(temps, key=lambda c: max(temps[c]) - min(temps[c])), "str", 0,
              [LOAD_WEATHER, "from collections import defaultdict\nt = defaultdict(list)\nfor r in weather:\n"
               "    t[r['city']].append(float(r['temp_c']))\nprint(max(t, key=lambda c: max(t[c]) - min(t[c])))"]))
    T.append(("From weather.csv: how much rain (mm) fell in Dunmere in June, July and August together, rounded to "
              "1 decimal?", round(summer_rain, 1), "float", 0.05,
              [LOAD_WEATHER, "round(sum(float(r['rain_mm']) for r in weather if r['city'] == 'Dunmere' "
               "and int(r['month']) in (6, 7, 8)), 1)"]))
    T.append(("How many integers from 1 to 100000 have a digit sum of exactly 20?",
              _digit_sum_count(5, 20), "int", 0,
              ["sum(1 for n in range(1, 100001) if sum(map(int, str(n))) == 20)"]))
    return [{"id": f"code-{k:03d}", "prompt": f"{p} Use the Python tool to compute it, then submit the answer "
             "with submit_result.", "answer": a, "answer_type": t, "tolerance": tol, "reference_cells": cells}
            for k, (p, a, t, tol, cells) in enumerate(T)]


def _digit_sum_count(digits: int, target: int) -> int:
    """Numbers with `digits` digits (leading zeros allowed) whose digits sum to target, by dynamic programming."""
    ways = [1] + [0] * target
    for _ in range(digits):
        ways = [sum(ways[s - d] for d in range(10) if s - d >= 0) for s in range(target + 1)]
    return ways[target]


def main() -> None:
    sys.path.insert(0, str(HERE.parents[2]))
    from rollout.envs.base import check_env, load_env

    rng = random.Random(SEED)
    sales, weather = sales_rows(rng), weather_rows(rng)
    files = {"sales.csv": to_csv(sales), "weather.csv": to_csv(weather)}
    tasks = make_tasks(sales, weather)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "code_interpreter"
        shutil.copytree(HERE, work, ignore=shutil.ignore_patterns("__pycache__", "files", "tasks.jsonl"))
        (work / "files").mkdir()
        for name, text in files.items():
            (work / "files" / name).write_text(text, encoding="utf-8")
        (work / "tasks.jsonl").write_text("", encoding="utf-8")
        report = check_env(load_env(str(work)), tasks)
        if not report["ok"]:
            raise SystemExit("check_env failed:\n" + "\n".join(report["failures"]))
    (HERE / "files").mkdir(exist_ok=True)
    for name, text in files.items():
        (HERE / "files" / name).write_text(text, encoding="utf-8")
    with open(HERE / "tasks.jsonl", "w", encoding="utf-8") as f:
        for task in tasks:
            f.write(json.dumps(task, ensure_ascii=False) + "\n")
    print(f"wrote {len(tasks)} tasks; check_env: {report['reference_passed']}/{report['with_reference']} reference "
          f"solutions pass, {report['perturbed_failed']}/{report['perturbed']} perturbed ones fail "
          f"({report['seconds']} s)")


if __name__ == "__main__":
    main()
