"""Builds `tasks.jsonl` of the code_repo environment from the declarative list below, and validates every task.

Run `python -m rollout.envs.code_repo.generate` from the repo root. A task is one injected bug in one of the clean
repositories under repos/: the clean text, the buggy text (the injection is clean -> buggy, the reference patch is
the inverse), the issue a user would write (symptoms, not the fix), the tests that the bug makes fail (F2P) and a
difficulty tag. Everything else is computed and checked here, in the sandbox, through the environment itself:
- every repository's tests all pass on its clean copy;
- on the buggy copy exactly the declared F2P tests fail; every other test of the repository passes (P2P);
- the reference patch, applied with apply_edit, gives back the clean files byte for byte (so F2P and P2P pass);
- the tag: easy = a one-line fix inside the function the issue names; hard = the bug is outside any function the
  issue names (a helper, a shared regex, another module);
- a sabotage edit (from the repository's candidates) that, after the fix, keeps F2P passing and breaks a P2P test,
  for check_env's "fixes the bug but breaks another test" perturbation;
- finally check_env over all tasks: every reference episode scores 1, every perturbed one 0.
Nothing is written unless all of it holds.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPOS = {"strkit": "text utilities", "spans": "times of day, intervals and a day planner",
         "ledger": "bank accounts in cents"}

# (repo, difficulty, path, clean text, buggy text, F2P test ids (file::name), issue)
TASKS = [
    ("strkit", "easy", "strkit/slug.py", 'parts = re.split(r"[^a-z0-9]+", plain)',
     'parts = re.split(r"[^a-z]+", plain)',
     ["test_slug.py::test_slugify_keeps_digits"],
     "slugify drops numbers\n\n`slugify(\"Top 10 tips for 2024\")` returns `\"top-tips-for\"`. I expected "
     "`\"top-10-tips-for-2024\"`: the numbers are part of the title, and now the URLs of two of our posts collide."),
    ("strkit", "easy", "strkit/slug.py", "if sep in cut and slug[max_len] != sep:",
     "if sep in cut and slug[max_len] == sep:", ["test_slug.py::test_slugify_max_len_cuts_at_a_separator"],
     "slugify(max_len=...) cuts words in half\n\n`slugify(\"the quick brown fox\", max_len=12)` gives "
     "`\"the-quick-br\"`. The docstring says the slug is cut at a separator when the cut would fall inside a word, "
     "so I expected `\"the-quick\"`."),
    ("strkit", "hard", "strkit/_text.py", 'unicodedata.normalize("NFKD", text)', 'unicodedata.normalize("NFC", text)',
     ["test_slug.py::test_slugify_accents", "test_stats.py::test_is_palindrome_accents"],
     "Accented letters vanish from slugs\n\n`slugify(\"Café au lait\")` returns `\"caf-au-lait\"` and "
     "`slugify(\"Crème brûlée\")` returns `\"cr-me-br-l-e\"`. The accents should just be dropped: "
     "`\"cafe-au-lait\"`, `\"creme-brulee\"`."),
    ("strkit", "easy", "strkit/slug.py", "slug, n = base, 2", "slug, n = base, 1", ["test_slug.py::test_unique_slug"],
     "unique_slug numbers the first duplicate -1\n\nWith \"my-post\" taken, `unique_slug(\"My Post\", {\"my-post\"})` "
     "returns `\"my-post-1\"`. The docstring (and all our old URLs) use -2 for the first duplicate, then -3, ..."),
    ("strkit", "hard", "strkit/case.py", r'(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")',
     r'(?<=[a-z0-9])(?=[A-Z])")',
     ["test_case.py::test_split_words", "test_case.py::test_snake_case_acronym"],
     "snake_case glues an acronym to the next word\n\n`snake_case(\"HTTPServerError\")` returns "
     "`\"httpserver_error\"`; it should be `\"http_server_error\"`."),
    ("strkit", "easy", "strkit/case.py", 'return head + "".join(part.capitalize() for part in parts[1:])',
     'return head + "".join(part for part in parts[1:])', ["test_case.py::test_camel_case"],
     "camel_case does not capitalise the words\n\n`camel_case(\"user id\")` returns `\"userid\"` rather than "
     "`\"userId\"`, and `camel_case(\"user_account_id\")` gives `\"useraccountid\"`."),
    ("strkit", "easy", "strkit/case.py", "if 0 < i < len(words) - 1 and lower in MINOR_WORDS:",
     "if 0 < i < len(words) and lower in MINOR_WORDS:", ["test_case.py::test_title_case_last_word"],
     "title_case leaves a small last word in lower case\n\n`title_case(\"what are you looking for\")` gives "
     "`\"What Are You Looking for\"`. The last word should be capitalised, like the first."),
    ("strkit", "easy", "strkit/wrap.py", "elif len(current) + 1 + len(word) <= width:",
     "elif len(current) + 1 + len(word) < width:", ["test_wrap.py::test_wrap_exact_fit"],
     "wrap splits a line that fits exactly\n\n`wrap(\"aaaa bbbbb\", 10)` returns `[\"aaaa\", \"bbbbb\"]`, although "
     "\"aaaa bbbbb\" is exactly 10 characters long and fits on one line."),
    ("strkit", "hard", "strkit/_text.py", 'return " ".join(text.split())', 'return " ".join(text.split(" "))',
     ["test_wrap.py::test_wrap_newlines", "test_case.py::test_title_case_minor_words"],
     "wrap keeps newlines inside lines\n\n`wrap(\"one\\ntwo three\", 20)` returns `[\"one\\ntwo three\"]`: the "
     "newline ends up inside the line. The docstring says whitespace, newlines included, only separates words, so "
     "I expected `[\"one two three\"]`."),
    ("strkit", "easy", "strkit/wrap.py", "room = limit - len(ellipsis)", "room = limit",
     ["test_wrap.py::test_truncate", "test_wrap.py::test_truncate_without_spaces"],
     "truncate returns text longer than the limit\n\n`truncate(\"abcdefghijklmnop\", 10)` returns "
     "`\"abcdefghij...\"`, 13 characters. The result should fit in the limit, ellipsis included."),
    ("strkit", "easy", "strkit/stats.py", "key=lambda item: (-item[1], item[0]))", "key=lambda item: -item[1])",
     ["test_stats.py::test_top_words"],
     "top_words ignores the alphabetical tie-break\n\n`top_words(\"pear fig apple fig pear apple kiwi\", 3)` "
     "returns `[(\"pear\", 2), (\"fig\", 2), (\"apple\", 2)]`. Words with the same count should come in alphabetical "
     "order, as the docstring says."),
    ("strkit", "hard", "strkit/_text.py", "_WORD = re.compile(r\"[A-Za-z0-9']+\")",
     "_WORD = re.compile(r\"[A-Za-z']+\")",
     ["test_stats.py::test_word_count_numbers"],
     "word_count skips numbers\n\n`word_count(\"3 little pigs and 1 wolf\")` is 4. The docstring says numbers count "
     "as words, so it should be 6."),
    ("strkit", "easy", "strkit/stats.py", "return -(-n // wpm)", "return n // wpm",
     ["test_stats.py::test_reading_time"],
     "reading_time rounds down\n\n450 words at 200 words a minute give `reading_time(...) == 2` instead of 3, and a "
     "two-word note takes 0 minutes."),
    ("strkit", "easy", "strkit/stats.py", "if ch.isalnum()]", "if ch.isalpha()]",
     ["test_stats.py::test_is_palindrome_digits"],
     "is_palindrome(\"12321\") is False\n\nNumbers like 12321 read the same backwards, but `is_palindrome` says "
     "they do not."),
    # ---------------------------------------------------------------------------------------------------- spans
    ("spans", "easy", "spans/timeparse.py", "if hours > 24 or minutes > 59 or", "if hours > 24 or minutes > 60 or",
     ["test_timeparse.py::test_parse_time_rejects_bad_times"],
     "parse_time accepts \"09:60\"\n\n`parse_time(\"09:60\")` returns 600 (the same as 10:00) instead of raising "
     "ValueError."),
    ("spans", "easy", "spans/timeparse.py", 'return f"{minutes // 60:02d}:{minutes % 60:02d}"',
     'return f"{minutes // 60:02d}:{minutes % 60}"',
     ["test_timeparse.py::test_format_time", "test_interval.py::test_repr"],
     "format_time drops the leading zero of the minutes\n\n`format_time(545)` returns `\"09:5\"` instead of "
     "`\"09:05\"`."),
    ("spans", "easy", "spans/timeparse.py", "if not m or not (m.group(1) or m.group(2)):", "if m is None:",
     ["test_timeparse.py::test_parse_duration_rejects_garbage"],
     "parse_duration(\"\") returns 0\n\nAn empty string (or one of spaces only) is not a duration, but "
     "`parse_duration(\"\")` returns 0 instead of raising ValueError."),
    ("spans", "hard", "spans/timeparse.py", r'_TIME = re.compile(r"^(\d{1,2}):(\d{2})$")',
     r'_TIME = re.compile(r"^(\d{2}):(\d{2})$")',
     ["test_timeparse.py::test_parse_time", "test_interval.py::test_interval_parse"],
     "Interval.parse rejects one-digit hours\n\n`Interval.parse(\"9:00-9:45\")` raises `ValueError: not a time: "
     "'9:00'`. Writing 09:00 works, but people type 9:00."),
    ("spans", "easy", "spans/interval.py", "return self.start < other.end and other.start < self.end",
     "return self.start <= other.end and other.start <= self.end", ["test_interval.py::test_overlaps"],
     "overlaps says back-to-back meetings overlap\n\n`Interval.parse(\"09:00-10:00\").overlaps(Interval.parse("
     "\"10:00-11:00\"))` is True. Intervals are half-open, so these two only touch."),
    ("spans", "easy", "spans/interval.py", "return self.start <= minute < self.end",
     "return self.start <= minute <= self.end", ["test_interval.py::test_contains"],
     "Interval.contains(end) is True\n\n`Interval(540, 600).contains(600)` returns True, but 10:00 is not part of "
     "09:00-10:00 (intervals are half-open)."),
    ("spans", "easy", "spans/interval.py", "return Interval(start, end) if start < end else None",
     "return Interval(start, end) if start <= end else None", ["test_interval.py::test_intersection"],
     "intersection of touching intervals is not None\n\n`Interval(540, 600).intersection(Interval(600, 660))` "
     "returns `Interval(10:00-10:00)`; the docstring says None when the two do not overlap."),
    ("spans", "easy", "spans/merge.py", "if out and iv.start <= out[-1].end:", "if out and iv.start < out[-1].end:",
     ["test_merge.py::test_merge_touching"],
     "merge does not join back-to-back intervals\n\n`merge([Interval(540, 600), Interval(600, 660)])` returns two "
     "intervals; the docstring says touching intervals are joined into one."),
    ("spans", "easy", "spans/merge.py", "out[-1] = Interval(out[-1].start, max(out[-1].end, iv.end))",
     "out[-1] = Interval(out[-1].start, iv.end)", ["test_merge.py::test_merge_nested"],
     "merge loses time when one interval lies inside another\n\n`merge([Interval(540, 720), Interval(600, 660)])` "
     "returns `[Interval(09:00-11:00)]`; it should be `[Interval(09:00-12:00)]`."),
    ("spans", "hard", "spans/merge.py", "for iv in sorted(intervals, key=lambda i: (i.start, i.end)):",
     "for iv in intervals:", ["test_merge.py::test_merge_unsorted", "test_schedule.py::test_free_slots"],
     "free_slots reports busy time as free\n\nWith busy = [Interval(600, 660), Interval(540, 570)] (10:00-11:00 "
     "and 09:00-09:30), `free_slots(busy, 480, 1020)` returns 08:00-10:00 and 11:00-17:00, but I am busy from 09:00 "
     "to 09:30. Expected: 08:00-09:00, 09:30-10:00 and 11:00-17:00."),
    ("spans", "easy", "spans/schedule.py", "if day_end - cursor >= min_length:", "if day_end - cursor > min_length:",
     ["test_schedule.py::test_free_slots_min_length"],
     "free_slots misses a last slot of exactly min_length\n\n`free_slots([Interval(540, 600)], 480, 660, "
     "min_length=60)` returns only 08:00-09:00. 10:00-11:00 is free too, and exactly 60 minutes long."),
    ("spans", "easy", "spans/week.py", "days = (weekday_index(weekday) - date.weekday()) % 7 or 7",
     "days = (weekday_index(weekday) - date.weekday()) % 7", ["test_week.py::test_next_weekday"],
     "next_weekday returns the same day\n\nOn a Wednesday, `next_weekday(date(2024, 5, 1), \"wed\")` returns "
     "2024-05-01 itself; it should be the following Wednesday, 2024-05-08."),
    ("spans", "hard", "spans/week.py", "key = name.strip()[:3].lower()", "key = name.strip()[:3]",
     ["test_week.py::test_weekday_index", "test_week.py::test_occurrences"],
     "occurrences fails for capitalised day names\n\n`occurrences(date(2024, 5, 1), \"Friday\", 3)` raises "
     "`ValueError: not a weekday: 'Friday'`. With \"friday\" it works."),
    # --------------------------------------------------------------------------------------------------- ledger
    ("ledger", "easy", "ledger/money.py", 'int((frac or "0").ljust(2, "0"))', 'int(frac or "0")',
     ["test_money.py::test_parse_amount_one_decimal"],
     "parse_amount reads \"1.5\" as 1 dollar 5 cents\n\n`parse_amount(\"1.5\")` returns 105 and "
     "`parse_amount(\"$0.5\")` returns 5; they should be 150 and 50 cents."),
    ("ledger", "easy", "ledger/money.py", "return -cents if sign else cents", "return cents",
     ["test_money.py::test_parse_amount_negative"],
     "parse_amount ignores the minus sign\n\n`parse_amount(\"-3.05\")` returns 305 and `parse_amount(\"-$2\")` "
     "returns 200."),
    ("ledger", "hard", "ledger/money.py", r"(\d{1,3}(?:,\d{3})*|\d+)", r"(\d{1,3}(?:,\d{3})?|\d+)",
     ["test_money.py::test_parse_amount_thousands"],
     "parse_amount rejects millions written with commas\n\n`parse_amount(\"$1,234,567.00\")` raises "
     "`ValueError: not an amount`, while `parse_amount(\"$1,234.00\")` works."),
    ("ledger", "easy", "ledger/money.py", 'return f"{sign}{whole:,}.{frac:02d}"', 'return f"{sign}{whole:,}.{frac}"',
     ["test_money.py::test_format_amount", "test_money.py::test_format_amount_negative",
      "test_account.py::test_insufficient_funds", "test_statement.py::test_statement_lines"],
     "format_amount(5) returns \"0.5\"\n\nAmounts lose the zero of their cents: `format_amount(5)` is `\"0.5\"` and "
     "`format_amount(100)` is `\"1.0\"`; they should read `\"0.05\"` and `\"1.00\"`."),
    ("ledger", "easy", "ledger/money.py", "whole, frac = divmod(abs(cents), 100)", "whole, frac = divmod(cents, 100)",
     ["test_money.py::test_format_amount_negative"],
     "format_amount garbles negative amounts\n\n`format_amount(-5)` returns `\"--1.95\"` instead of `\"-0.05\"`."),
    ("ledger", "easy", "ledger/money.py", "base + 1 if i < extra else base", "base + 1 if i <= extra else base",
     ["test_money.py::test_split_evenly"],
     "split_evenly hands out a cent too many\n\n`split_evenly(100, 3)` returns `[34, 34, 33]`, which adds up to 101."),
    ("ledger", "easy", "ledger/money.py", "exact.quantize(Decimal(1), rounding=ROUND_HALF_UP)",
     "exact.quantize(Decimal(1))", ["test_money.py::test_percent_of"],
     "percent_of rounds half a cent down\n\n`percent_of(5, 10)` returns 0 and `percent_of(25, 10)` returns 2; the "
     "docstring promises rounding half up (1 and 3)."),
    ("ledger", "hard", "ledger/account.py", "return self.balance - cents >= -self.overdraft",
     "return self.balance - cents >= 0", ["test_account.py::test_overdraft"],
     "withdraw ignores the overdraft\n\n```\nacct = Account(\"bob\", 100, overdraft=500)\nacct.withdraw(600)\n```\n"
     "raises InsufficientFunds, though the overdraft allows the balance to go down to -5.00."),
    ("ledger", "hard", "ledger/account.py", "or cents <= 0:", "or cents < 0:",
     ["test_account.py::test_invalid_amounts"],
     "deposit(0) is accepted\n\n`Account(\"ann\", 1000).deposit(0)` adds a `(\"deposit\", 0, \"\")` entry to the "
     "history. A zero amount should raise InvalidAmount, like a negative one (withdraw(0) has the same problem)."),
    ("ledger", "easy", "ledger/transfer.py", "return min(max(percent_of(cents, FEE_PERCENT), MIN_FEE), MAX_FEE)",
     "return max(percent_of(cents, FEE_PERCENT), MIN_FEE)", ["test_transfer.py::test_transfer_fee"],
     "transfer_fee has no maximum\n\n`transfer_fee(500000)` returns 5000 (50.00); the fee should be capped at "
     "10.00."),
    ("ledger", "easy", "ledger/transfer.py", "if not src.can_withdraw(cents + fee):", "if not src.can_withdraw(cents):",
     ["test_transfer.py::test_transfer_is_all_or_nothing"],
     "transfer loses money when the fee is not covered\n\nann has 100.00 and sends bob 100.00: "
     "`transfer(ann, bob, 10000)` raises InsufficientFunds, but afterwards ann's balance is 0.00 and bob got "
     "nothing. A failed transfer should leave both accounts as they were."),
    ("ledger", "easy", "ledger/transfer.py", "fee = transfer_fee(cents, same_owner=src.owner == dst.owner)",
     "fee = transfer_fee(cents)", ["test_transfer.py::test_transfer_between_own_accounts_is_free"],
     "transfer charges a fee between my own accounts\n\n`transfer(checking, savings, 1000)` between two accounts "
     "of \"ann\" raises InsufficientFunds because it wants a 0.50 fee; moving money between accounts of one owner "
     "should be free."),
    ("ledger", "hard", "ledger/transfer.py", 'src.withdraw(fee, "fee")', "src.withdraw(fee, memo)",
     ["test_statement.py::test_totals", "test_transfer.py::test_transfer_moves_money_and_fee"],
     "totals counts fees as withdrawals\n\nann deposits 50.00, pays 10.00 rent and sends 20.00 to bob (with the 0.50 "
     "fee). `totals(ann)` is `{\"deposits\": 5000, \"withdrawals\": 3050, \"fees\": 0}`; the fee should be under "
     "\"fees\": `{\"deposits\": 5000, \"withdrawals\": 3000, \"fees\": 50}`."),
    ("ledger", "easy", "ledger/statement.py", 'balance += cents if kind == "deposit" else -cents', "balance += cents",
     ["test_statement.py::test_statement_lines", "test_statement.py::test_statement_opening_balance"],
     "statement's running balance goes up on withdrawals\n\nAfter a 10.50 deposit and a 3.00 withdrawal, the "
     "withdrawal line and the closing line of `statement(acct)` show 13.50 instead of 7.50."),
    ("ledger", "easy", "ledger/statement.py", "Decimal(str(annual_percent)) / 12)", "Decimal(str(annual_percent)))",
     ["test_statement.py::test_monthly_interest"],
     "monthly_interest returns a whole year's interest\n\n`monthly_interest(120000, 6)` returns 7200 (72.00). One "
     "month at 6% a year on 1,200.00 is 6.00."),
]

# Per repository, edits that break some test (clean -> broken); each task gets the first one that, after its fix,
# leaves its F2P tests passing and breaks a P2P test.
SABOTAGE = {
    "strkit": [("strkit/wrap.py", "prefix + line if line.strip() or not skip_blank else line", "prefix + line"),
               ("strkit/slug.py", 'or "item"', 'or "untitled"')],
    "spans": [("spans/interval.py", "if end < start:", "if end + 10 < start:"),
              ("spans/schedule.py", 'if not line or line.startswith("#"):', "if not line:")],
    "ledger": [("ledger/transfer.py", "if src is dst:", "if src is dst and False:"),
               ("ledger/account.py", "if overdraft < 0:", "if overdraft < -100:")],
}


def edit(path: str, search: str, replace: str) -> dict:
    return {"path": path, "search": search, "replace": replace}


def build_tasks() -> list[dict]:
    tasks, counters = [], {}
    for repo, difficulty, path, clean, buggy, f2p, issue in TASKS:
        counters[repo] = counters.get(repo, 0) + 1
        title, _, body = issue.partition("\n\n")
        tasks.append({
            "id": f"{repo}-{counters[repo]:02d}", "repo": repo, "difficulty": difficulty,
            "prompt": f"[{repo}: {REPOS[repo]}] {title}\n\n{body}",
            "bug": [edit(path, clean, buggy)], "patch": [edit(path, buggy, clean)],
            "f2p": [f"tests/{t}" for t in f2p], "p2p": [], "sabotage": [],
        })
    return tasks


def enclosing_function(source: str, offset: int) -> str | None:
    """The innermost function or method whose body holds the character at `offset`, or None (module level)."""
    line = source.count("\n", 0, offset) + 1
    best = None
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= node.end_lineno:
            if best is None or node.lineno > best.lineno:
                best = node
    return None if best is None else best.name


def check_tag(task: dict, clean_source: str) -> None:
    (bug,) = task["bug"]
    where = enclosing_function(clean_source, clean_source.index(bug["search"]))
    named = where is not None and re.search(rf"\b{re.escape(where)}\b", task["prompt"]) is not None
    one_line = "\n" not in bug["search"].strip("\n") and "\n" not in bug["replace"].strip("\n")
    if task["difficulty"] == "easy" and not (named and one_line):
        raise SystemExit(f"{task['id']}: tagged easy, but the bug is in {where or 'module-level code'}, which the "
                         f"issue does not name, or the fix is not one line")
    if task["difficulty"] == "hard" and named:
        raise SystemExit(f"{task['id']}: tagged hard, but the issue names {where}, the function holding the bug")


def validate(env, tasks: list[dict]) -> None:
    """Fills in p2p and sabotage, checking everything the module docstring lists (SystemExit on a failure)."""
    mod = env.module
    clean_files, all_ids = {}, {}
    for repo in REPOS:
        probe = {"id": f"clean-{repo}", "prompt": "-", "repo": repo}
        s = env.reset(probe)
        try:
            clean_files[repo] = mod.snapshot(s.state)
            out = mod.run_suite(s.state, clean_files[repo], None, 60)
        finally:
            s.close()
        bad = [r["id"] for r in out["results"] if not r["passed"]]
        if out["status"] != "ok" or bad or not out["results"]:
            raise SystemExit(f"{repo}: the clean repository's tests do not all pass ({out['status']}): {bad}")
        all_ids[repo] = [r["id"] for r in out["results"]]
        if not 10 <= len(all_ids[repo]) <= 25:
            raise SystemExit(f"{repo}: {len(all_ids[repo])} tests; keep 10 to 25")
    for task in tasks:
        repo, tid = task["repo"], task["id"]
        check_tag(task, clean_files[repo][task["bug"][0]["path"]].decode())
        s = env.reset(task)
        try:
            out = mod.run_suite(s.state, mod.snapshot(s.state), None, 60)
            failing = sorted(r["id"] for r in out["results"] if not r["passed"])
            if out["status"] != "ok" or failing != sorted(task["f2p"]):
                raise SystemExit(f"{tid}: on the buggy copy these tests fail: {failing}; declared F2P: "
                                 f"{sorted(task['f2p'])} ({out['status']})")
            task["p2p"] = [t for t in all_ids[repo] if t not in task["f2p"]]
            for e in task["patch"]:
                res = s.call("apply_edit", e)
                if res.status != "ok":
                    raise SystemExit(f"{tid}: the reference patch does not apply: {res.content}")
            if mod.snapshot(s.state) != clean_files[repo]:
                raise SystemExit(f"{tid}: the reference patch does not give back the clean repository")
            task["sabotage"] = pick_sabotage(s.state, mod, task, clean_files[repo])
        finally:
            s.close()


def pick_sabotage(state, mod, task: dict, clean: dict) -> list[dict]:
    for path, good, bad in SABOTAGE[task["repo"]]:
        text = clean[path].decode()
        if text.count(good) != 1:
            raise SystemExit(f"{task['repo']}: the sabotage text {good!r} does not occur exactly once in {path}")
        files = {**clean, path: text.replace(good, bad).encode()}
        out = mod.run_suite(state, files, task["f2p"] + task["p2p"], 60)
        passed = {r["id"] for r in out["results"] if r["passed"]}
        if set(task["f2p"]) <= passed and any(t not in passed for t in task["p2p"]):
            return [edit(path, good, bad)]
    raise SystemExit(f"{task['id']}: no sabotage candidate breaks a pass-to-pass test while the fix holds")


def main() -> None:
    sys.path.insert(0, str(HERE.parents[2]))
    from rollout.envs.base import check_env, load_env

    tasks = build_tasks()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "code_repo"
        shutil.copytree(HERE, work, ignore=shutil.ignore_patterns("__pycache__", "tasks.jsonl"))
        (work / "tasks.jsonl").write_text("", encoding="utf-8")
        env = load_env(str(work))
        validate(env, tasks)
        report = check_env(env, tasks)
        if not report["ok"]:
            raise SystemExit("check_env failed:\n" + "\n".join(report["failures"]))
    with open(HERE / "tasks.jsonl", "w", encoding="utf-8") as f:
        for task in tasks:
            f.write(json.dumps(task, ensure_ascii=False) + "\n")
    easy = sum(t["difficulty"] == "easy" for t in tasks)
    print(f"wrote {len(tasks)} tasks ({easy} easy, {len(tasks) - easy} hard) over {len(REPOS)} repositories; "
          f"check_env: {report['reference_passed']}/{report['with_reference']} reference solutions pass, "
          f"{report['perturbed_failed']}/{report['perturbed']} perturbed ones fail ({report['seconds']} s)")


if __name__ == "__main__":
    main()
