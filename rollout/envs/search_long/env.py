"""Long search agent: the `search` environment's engine over a larger encyclopedia whose questions are chains of 5
to 8 articles, so that solving one the intended way (search, then open_document, per article) needs more tokens
than a context window of 2048-3072 holds. It is the task set for context management (agent.context_strategy) and
for benchmarks/context_strategies.py; docs.jsonl, tasks.jsonl and the held-out tasks (rl/bundled/eval/
search_long.jsonl) come from generate.py, seeded.

The tools, the database and the verifier are the search environment's (rollout/envs/search/env.py), imported, not
copied: that directory has no __init__.py, so `rollout.envs.search` imports as a namespace package. That module is
then loaded twice (once by name here, once by load_env("search") under its own name), which is harmless: its
functions keep no state beyond a cached FTS5 probe. The database is this directory's own (build_db reads
`env_dir/docs.jsonl`; the cache key holds this environment's name and data). `search` and `open_document` are thin
wrappers only so that their docstrings, which become the tool schemas the model reads, give examples from this
world instead of the other one's.
"""

from __future__ import annotations

from typing import Annotated

from rollout.envs.search import env as _search

build_db = _search.build_db
init_state = _search.init_state
verify = _search.verify  # normalized exact match against task["answers"]
solve = _search.solve  # per hop: search hop["query"] (its article among the first five results), open it; submit
submit_result = _search.submit_result


def search(state, query: str, k: Annotated[int, {"minimum": 1, "maximum": 10}] = 5) -> list[dict]:
    """Search the encyclopedia; the best matches first (BM25, titles weighted up).

    Args:
        query: words to look for, best the name of the person, town, bridge, company, university or river you
            want, e.g. "Ada Vell".
        k: how many results, 1 to 10.

    Returns:
        A list of {"doc_id", "title", "snippet"}; matched words are in [brackets].
    """
    return _search.search(state, query, k)


def open_document(state, doc_id: str) -> dict:
    """Read a whole article.

    Args:
        doc_id: the article's id, as search returns it (e.g. "ada_vell").
    """
    return _search.open_document(state, doc_id)


TOOLS = [search, open_document, submit_result]


def perturb_submission(task, value) -> dict:
    """The search environment's near misses (extended, truncated), plus the two wrong answers a chain invites: the
    same kind of value one article too early (the year of the entity before the last) and an off-by-one number."""
    out = _search.perturb_submission(task, value)
    out["previous_hop"] = task["previous_answer"]
    if value.strip().isdigit():
        out["off_by_one"] = str(int(value) + 1)
    return out
