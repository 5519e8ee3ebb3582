"""Regenerate sft.jsonl: 64 OpenAI-style chat rows for the embedded SFT default (`+experiment=sft`), made from the
bundled math and logic tasks with their answers (some with reasoning_content, some two-turn) and from the `smoke`
environment's key-value store as tool-call round trips (lookup, then submit_result), in the agent's own setting (its
system text and tool schemas, rollout/envs/smoke/).

Run `python rl/bundled/generate_sft.py` from the repo root. Rows hold only list-valued fields (`messages`, `tools`):
the embedded tokenizer is trained on the top-level strings of rl/bundled/*.jsonl (rl/models.py), which this file
must leave unchanged.
"""

import json
import random
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MATH_SYSTEM = "Solve the problem. Put the final answer in \\boxed{}."
# rollout/envs/smoke: env.yaml's description and the tool schemas `load_env("smoke").tool_schemas()` derives
SMOKE_SYSTEM = ("A tiny key-value store. Look values up with the lookup tool and submit the value the task asks for "
                "with submit_result.")
SMOKE_TOOLS = [
    {"type": "function", "function": {
        "name": "lookup", "description": "Look up the value stored under a key. Returns: The stored value as text.",
        "parameters": {"type": "object", "properties": {"key": {
            "type": "string", "description": "the key, exactly as written in the task (e.g. \"alpha\")."}},
            "required": ["key"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "submit_result", "description": "Submit the final answer; this ends the episode.",
        "parameters": {"type": "object", "properties": {"answer": {
            "type": "string", "description": "the value the task asks for."}},
            "required": ["answer"], "additionalProperties": False}}},
]


def read(name: str) -> list[dict]:
    return [json.loads(x) for x in (HERE / name).read_text().splitlines() if x.strip()]


def worked(question: str, answer: str) -> str | None:
    """A one-line reasoning for the sums and products, None for other questions."""
    m = re.fullmatch(r"What is (\d+) \+ (\d+)\?", question) or re.fullmatch(r"Compute (\d+) \\times (\d+)\.?", question)
    if not m:
        return None
    op = "+" if "+" in question else "*"
    return f"{m.group(1)} {op} {m.group(2)} = {answer}, so the answer is {answer}."


def math_row(task: dict, think: bool) -> dict:
    reply = {"role": "assistant", "content": f"The answer is \\boxed{{{task['answer']}}}."}
    reasoning = worked(task["question"], task["answer"])
    if think and reasoning:
        reply["reasoning_content"] = reasoning
    return {"messages": [{"role": "system", "content": MATH_SYSTEM}, {"role": "user", "content": task["question"]},
                         reply]}


def two_turn_row(a: dict, b: dict) -> dict:
    messages = math_row(a, think=False)["messages"]
    messages += [{"role": "user", "content": f"Now this one: {b['question']}"},
                 {"role": "assistant", "content": f"The answer is \\boxed{{{b['answer']}}}."}]
    return {"messages": messages}


def logic_row(task: dict) -> dict:
    return {"messages": [{"role": "user", "content": task["prompt"]},
                         {"role": "assistant", "content": f"Answer: {task['answer']}"}]}


def call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def tool_row(key: str, value: str) -> dict:
    return {"tools": SMOKE_TOOLS, "messages": [
        {"role": "system", "content": SMOKE_SYSTEM},
        {"role": "user", "content": f"What value is stored under the key '{key}'? Submit it."},
        {"role": "assistant", "content": "", "tool_calls": [call("lookup", key=key)]},
        {"role": "tool", "content": value},
        {"role": "assistant", "content": "", "tool_calls": [call("submit_result", answer=value)]},
        {"role": "tool", "content": "Submitted."},
    ]}


def main() -> None:
    rng = random.Random(35)
    maths = [t for t in read("math.jsonl") if len(t["question"]) < 120]
    sums = [t for t in maths if worked(t["question"], t["answer"])]
    others = [t for t in maths if not worked(t["question"], t["answer"])]
    rows = [math_row(t, think=i % 2 == 0) for i, t in enumerate(rng.sample(sums, 20))]
    rows += [math_row(t, think=False) for t in rng.sample(others, 16)]
    rows += [logic_row(t) for t in rng.sample(read("logic.jsonl"), 12)]
    rows += [two_turn_row(*rng.sample(maths, 2)) for _ in range(8)]
    store = json.loads((ROOT / "rollout" / "envs" / "smoke" / "data.json").read_text())["entries"]
    # the table's first 8 keys: it grew to 26 (a larger held-out set for tool use) after this file was written
    rows += [tool_row(e["key"], e["value"]) for e in store[:8]]
    rng.shuffle(rows)
    (HERE / "sft.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} rows to {HERE / 'sft.jsonl'}")


if __name__ == "__main__":
    main()
