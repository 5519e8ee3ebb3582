"""Local search agent: SQLite FTS5 (BM25, Porter stemming) over a bundled encyclopedia of a fictional world
(docs.jsonl, written for this environment so no model knows it beforehand), and multi-hop questions whose answers
need two or more articles. Verifier: normalized exact match against the task's accepted answers.
"""

from __future__ import annotations

import functools
import json
import re
import sqlite3
from typing import Annotated

from rewards.rule_rewards import normalize_short_answer
from rollout.envs.base import ToolError

# Dropped from queries when other words remain: in an OR query they only add noise to the ranking.
STOPWORDS = frozenset("a an and are as at by did do does for from had has in is it of on or the to was what when "
                      "where which who whom whose why with".split())


@functools.cache
def require_fts5() -> None:
    """FTS5 must be compiled into this Python's SQLite; fail clearly (once) when it is not."""
    try:
        sqlite3.connect(":memory:").execute("CREATE VIRTUAL TABLE probe USING fts5(x)")
    except sqlite3.OperationalError as exc:
        raise RuntimeError(f"the search environment needs SQLite's FTS5, which this Python's sqlite3 (SQLite "
                           f"{sqlite3.sqlite_version}) lacks ({exc}); use a Python built against an SQLite with "
                           "FTS5 (python.org and distribution builds have it)") from None


def build_db(conn, env_dir):
    require_fts5()
    conn.execute("CREATE TABLE documents (doc_id TEXT PRIMARY KEY, title TEXT, text TEXT)")
    conn.execute("CREATE VIRTUAL TABLE docs_fts USING fts5(doc_id UNINDEXED, title, text, "
                 "tokenize = 'porter unicode61')")
    for line in (env_dir / "docs.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            doc = json.loads(line)
            row = (doc["id"], doc["title"], doc["text"])
            conn.execute("INSERT INTO documents VALUES (?, ?, ?)", row)
            conn.execute("INSERT INTO docs_fts VALUES (?, ?, ?)", row)


def init_state(state):
    require_fts5()  # a cached database built elsewhere is no use without FTS5 here


def fts_query(text: str) -> str | None:
    """A free-text query as an FTS5 expression: its words, each quoted (so no FTS syntax gets through), OR-ed."""
    words = [w for w in re.findall(r"\w+", text.lower()) if len(w) > 1 or w.isdigit()]
    content = [w for w in words if w not in STOPWORDS] or words
    return " OR ".join(f'"{w}"' for w in dict.fromkeys(content)) or None


def search(state, query: str, k: Annotated[int, {"minimum": 1, "maximum": 10}] = 5) -> list[dict]:
    """Search the encyclopedia; the best matches first (BM25, titles weighted up).

    Args:
        query: words to look for, e.g. "founder of Tellari Instruments".
        k: how many results, 1 to 10.

    Returns:
        A list of {"doc_id", "title", "snippet"}; matched words are in [brackets].
    """
    expr = fts_query(query)
    if expr is None:
        raise ToolError("the query has no words to search for")
    rows = state.db.execute(
        "SELECT doc_id, title, snippet(docs_fts, 2, '[', ']', ' ... ', 20) AS snippet FROM docs_fts "
        "WHERE docs_fts MATCH ? ORDER BY bm25(docs_fts, 0.0, 5.0, 1.0) LIMIT ?", (expr, k)).fetchall()
    return [dict(r) for r in rows]


def open_document(state, doc_id: str) -> dict:
    """Read a whole article.

    Args:
        doc_id: the article's id, as search returns it (e.g. "marta_osk").
    """
    row = state.db.execute("SELECT doc_id, title, text FROM documents WHERE doc_id = ?", (doc_id.strip(),)).fetchone()
    if row is None:
        raise ToolError(f"no article with id {doc_id!r}; search returns the ids")
    return dict(row)


def submit_result(state, answer: str) -> str:
    """Submit the final answer; this ends the episode. Only the first submission counts.

    Args:
        answer: the answer as a short phrase (a name, a place, a year), without explanation.
    """
    return "Answer submitted."


TOOLS = [search, open_document, submit_result]


def verify(task, state):
    if not state.submitted:
        return 0.0, "nothing was submitted"
    got = normalize_short_answer(str(state.submission))
    if any(got == normalize_short_answer(a) for a in task["answers"]):
        return 1.0, None
    return 0.0, f"submitted {str(state.submission)[:80]!r}, expected {task['answers'][0]!r}"


def solve(task, call):
    """Follows the task's hops: each query must find its article among the first five results, which is read."""
    for hop in task["hops"]:
        found = [r["doc_id"] for r in call("search", query=hop["query"], k=5)]
        if hop["doc"] not in found:
            raise RuntimeError(f"search {hop['query']!r} does not find {hop['doc']} (got {found})")
        call("open_document", doc_id=hop["doc"])
    call("submit_result", answer=task["answers"][0])


def perturb_submission(task, value) -> dict:
    """Near misses of the right answer: extended by more words, and cut in half."""
    return {"extended": f"{value} and more", "truncated": value[: max(1, len(value) // 2)]}
