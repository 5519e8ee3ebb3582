"""`python -m launch.generate +experiment=... [generate.k=4 generate.out=DIR ...]`: data from specialists (stage one of
the V3.2 recipe, issue 35). For every domain (`generate.domains`, default all) and thinking mode
(`domains.<d>.thinking`: true, false or both; null = one pass in the chat template's default, recorded as mode null),
a generator model (`generate.generators.<d>`: one path, or one per mode; default `model.path`) samples `generate.k`
responses per prompt of `domains.<d>.dataset` (agent domains: k whole multi-turn episodes against the domain's
environment), each scored by the domain's own reward stack (`launch.score.reward_composer`, the rubric judge
included). `generate.keep` says which go to `<out>/data.jsonl`: pass (rejection sampling: every sample whose outcome,
the domain's first reward part, reaches `generate.pass_threshold`), best (the passing sample of highest total reward
per prompt and mode) or all (every sample, with `passed`). The engine is `rollout.engine` (vLLM on a GPU, the
transformers engine on a CPU) in this process, as `launch.filter_tasks` runs it; sampling settings are `rollout.*`.

A row (one JSON line, HF-loadable, the SFT data of `python -m launch.sft algorithm.dataset.path=<out>/data.jsonl`):
`messages` (OpenAI-style: [system], user, assistant with `reasoning_content` split out of a thinking response; an
agent episode's whole conversation, tool calls with JSON-string arguments and `tool` results as the model read
them), `tools` (agent domains: the environment's tool schemas), `domain`, `mode` ("thinking" | "non_thinking" |
null), `generator` (the model path as configured), `prompt_id` ("<domain>-<row index>", stable across runs),
`sample_index`, `reward`, `parts`, `passed`, `finish_reason`, and the exact tokens sampled: `token_ids` (prompt and
response) with `loss_mask` (1 on the generated tokens), which SFT trains on token for token when
`algorithm.dataset.columns` maps them (rl/sft_data.py; for templates that cannot render the rows' tools).

Resumable: each generate call's rows are appended to data.jsonl, then one line to progress.jsonl with the prompts it
finished and data.jsonl's size after them. A rerun with the same `generate.out` (and k, keep, pass_threshold:
settings.json) reads progress.jsonl, cuts data.jsonl back to the last size recorded there (rows of a call cut off
midway go) and generates the prompts not yet done; `COMPLETE` (the summary, JSON) is written when every prompt is
done, and removed while a rerun adds more (a pipeline skips the stage when `<out>/COMPLETE` exists). Progress: a
log line per call (done/total prompts of the domain and mode); at the end one summary line per (domain, mode).

Generators run one after another (their prompts grouped by model), each engine released before the next loads.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import zlib
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from launch.config import check_model_path, compose, prepare
from launch.score import reward_composer
from launch.tracking import json_line
from rewards.compose import required_fields
from rl.config import ConfigError, check_number
from rl.data import load_domain_rows, render_prompt, thinking_modes
from rl.models import resolve_model_path

log = logging.getLogger(__name__)
KEEP = ("pass", "best", "all")
MODE_NAMES = {True: "thinking", False: "non_thinking", None: None}
SETTINGS = ("k", "keep", "pass_threshold")  # a rerun into the same out must keep them: they decide which rows exist


# -- the config ------------------------------------------------------------------------------------------------------
def check_generate(cfg: dict) -> dict:
    """The `generate` block checked (ConfigError names the key); `cfg["domains"]` narrowed to generate.domains."""
    g = cfg.get("generate")
    if not isinstance(g, Mapping):
        raise ConfigError("generate: missing (conf/generate/default.yaml holds its keys)")
    if not g.get("out") or not isinstance(g["out"], str):
        raise ConfigError(f"generate.out must be a folder path, got {g.get('out')!r}")
    check_number(g, "k", "generate", lo=1, integer=True)
    if g.get("keep") not in KEEP:
        raise ConfigError(f"generate.keep must be one of {list(KEEP)}, got {g.get('keep')!r}")
    check_number(g, "pass_threshold", "generate", allow_inf=True)  # -inf: every sample passes
    check_number(g, "max_prompts", "generate", lo=1, integer=True, optional=True)
    check_number(g, "batch_prompts", "generate", lo=1, integer=True)
    domains = cfg.get("domains") or {}
    chosen = g.get("domains")
    if chosen is not None:
        if isinstance(chosen, str):
            chosen = [chosen]
        if not isinstance(chosen, list) or not chosen:
            raise ConfigError(f"generate.domains must be a list of domain names or null, got {chosen!r}")
        unknown = [d for d in chosen if d not in domains]
        if unknown:
            raise ConfigError(f"generate.domains: {unknown[0]!r} is not a domain of the config (domains: "
                              f"{sorted(domains)})")
        cfg["domains"] = {d: domains[d] for d in chosen}
    return g


def check_generators(g: Mapping, cfg: Mapping) -> None:
    """`generate.generators` (after the domains are checked): per domain a path, or one per mode it generates in;
    every path a model (`launch.config.check_model_path`)."""
    domains = cfg["domains"]
    generators = g.get("generators") or {}
    if not isinstance(generators, Mapping):
        raise ConfigError("generate.generators must be a mapping: domain -> path, or -> {thinking, non_thinking}")
    for d, entry in generators.items():
        where = f"generate.generators.{d}"
        if d not in domains:
            raise ConfigError(f"{where}: {d!r} is not a domain of the config (domains: {sorted(domains)})")
        if isinstance(entry, str) and entry.strip():
            continue
        if not isinstance(entry, Mapping) or not entry:
            raise ConfigError(f"{where} must be a model path or {{thinking: <path>, non_thinking: <path>}}")
        modes = {MODE_NAMES[m] for m in thinking_modes(domains[d]) or [None]}
        for mode, path in entry.items():
            if mode not in ("thinking", "non_thinking"):
                raise ConfigError(f"{where}.{mode}: unknown key; allowed: ['non_thinking', 'thinking']")
            if not isinstance(path, str) or not path.strip():
                raise ConfigError(f"{where}.{mode} must be a model path, got {path!r}")
            if mode not in modes:
                raise ConfigError(f"{where}.{mode}: domain {d} does not generate in that mode (domains.{d}.thinking="
                                  f"{domains[d].get('thinking')}); set its thinking mode, or give one path")
    paths = {generator_of(g, cfg, d, m) for d, spec in domains.items() for m in thinking_modes(spec) or [None]}
    for path in sorted(paths):
        try:
            check_model_path(path)
        except ConfigError as e:
            raise ConfigError(f"generate.generators: {e}") from None


def generator_of(g: Mapping, cfg: Mapping, domain: str, mode: bool | None) -> str:
    """The model path (as configured) that samples `domain` in `mode`."""
    entry = (g.get("generators") or {}).get(domain)
    if isinstance(entry, str):
        return entry
    if isinstance(entry, Mapping) and MODE_NAMES[mode] in entry:
        return str(entry[MODE_NAMES[mode]])
    return str(cfg["model"]["path"])


# -- the output folder -----------------------------------------------------------------------------------------------
class Output:
    """`out`/data.jsonl and progress.jsonl (see the module docstring): what is done, appending, the summary."""

    def __init__(self, out: Path, settings: dict):
        self.dir = out
        out.mkdir(parents=True, exist_ok=True)
        self.data, self.progress, self.complete = out / "data.jsonl", out / "progress.jsonl", out / "COMPLETE"
        saved = out / "settings.json"
        if saved.exists():
            before = json.loads(saved.read_text())
            changed = [k for k in SETTINGS if before.get(k) != settings[k]]
            if changed:
                k = changed[0]
                raise ConfigError(f"generate.{k}={settings[k]}: generate.out={out} holds data generated with "
                                  f"generate.{k}={before.get(k)}; rerun with the same settings, or another out")
            # a (domain, mode) keeps the model that generated its first rows; new domains may join
            old_gen, new_gen = before.get("generators") or {}, settings.get("generators") or {}
            moved = sorted(u for u in set(old_gen) & set(new_gen) if old_gen[u] != new_gen[u])
            if moved:
                raise ConfigError(f"generate.generators: generate.out={out} holds {moved[0]} rows generated by "
                                  f"{old_gen[moved[0]]}, and this run would add rows by {new_gen[moved[0]]}; rerun "
                                  "with the same generators, or another out")
            saved.write_text(json.dumps({**before, "generators": {**old_gen, **new_gen}}) + "\n")
        else:
            saved.write_text(json.dumps(settings) + "\n")
        self.done: dict[tuple[str, str | None], dict] = {}  # (prompt_id, mode) -> its record
        size, good = 0, 0
        if self.progress.exists():
            raw = self.progress.read_bytes()
            for line in raw.splitlines(keepends=True):
                try:
                    call = json.loads(line)
                except ValueError:  # a line cut off mid-write: that call did not finish
                    break
                if not line.endswith(b"\n"):
                    break
                good += len(line)
                size = int(call["data_bytes"])
                for rec in call["prompts"]:
                    self.done[rec["prompt_id"], rec["mode"]] = rec
            if good < len(raw):
                with self.progress.open("r+b") as f:
                    f.truncate(good)
        if self.data.exists() and self.data.stat().st_size != size:
            log.info("generate: %s: cutting back to the %d bytes the last finished call left (a call was cut off)",
                     self.data, size)
            with self.data.open("r+b") as f:
                f.truncate(size)

    def add(self, rows: list[dict], records: list[dict]) -> None:
        """One call's rows, then its progress line: a cut-off between them leaves rows that the next run drops."""
        with self.data.open("a", encoding="utf-8") as f:
            f.writelines(json_line(r) for r in rows)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        with self.progress.open("a", encoding="utf-8") as f:
            f.write(json_line({"prompts": records, "data_bytes": size}))
            f.flush()
            os.fsync(f.fileno())
        for rec in records:
            self.done[rec["prompt_id"], rec["mode"]] = rec

    def summary(self) -> list[dict]:
        """Per (domain, mode): prompts, samples, kept rows and the mean reward of the samples."""
        acc: dict[tuple, dict] = defaultdict(lambda: {"prompts": 0, "samples": 0, "kept": 0, "reward_sum": 0.0})
        for rec in self.done.values():
            a = acc[rec["domain"], rec["mode"]]
            a["prompts"] += 1
            a["samples"] += rec["samples"]
            a["kept"] += rec["kept"]
            a["reward_sum"] += rec["reward_sum"]
        return [{"domain": d, "mode": m, "prompts": a["prompts"], "samples": a["samples"], "kept": a["kept"],
                 "mean_reward": a["reward_sum"] / a["samples"] if a["samples"] else None}
                for (d, m), a in sorted(acc.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))]

    def finish(self) -> None:
        tmp = self.complete.with_name(".COMPLETE.tmp")
        tmp.write_text(json.dumps({"summary": self.summary()}, indent=1) + "\n")
        os.replace(tmp, self.complete)


# -- the rows --------------------------------------------------------------------------------------------------------
def single_turn_messages(system: str | None, prompt: str, response: str, thinking: bool | None) -> list[dict]:
    """[system], user, assistant; a response that may think (mode thinking, or the template's default) has its
    reasoning split out as `reasoning_content` (rollout/thinking.py). Non-thinking: `reasoning_content` "", which
    ChatML templates (the embedded one, Qwen3's) render as the empty think block the prompt pre-filled, so the SFT
    sequence is the one the model sampled in."""
    from rollout.thinking import split_reasoning

    assistant = {"role": "assistant", "content": response}
    if thinking is False:
        assistant["reasoning_content"] = ""
    else:
        reasoning, rest = split_reasoning(response)
        if reasoning is not None:
            assistant = {"role": "assistant", "content": rest.strip(), "reasoning_content": reasoning}
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt},
                                                                          assistant]


def episode_messages(messages: list[dict], thinking: bool | None) -> list[dict]:
    """An agent episode's messages (rollout/agent.py) with tool-call arguments as JSON strings (OpenAI's form; one
    type per column, so the rows load with HF datasets whatever the arguments hold); non-thinking assistant turns
    get `reasoning_content` "" (see `single_turn_messages`)."""
    out = []
    for m in messages:
        m = dict(m)
        if m["role"] == "assistant" and thinking is False and m.get("reasoning_content") is None:
            m["reasoning_content"] = ""
        if m.get("tool_calls"):
            m["tool_calls"] = [{"type": "function", "function": {
                "name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"], ensure_ascii=False)}}
                for c in m["tool_calls"]]
        out.append(m)
    return out


def select(trajs: list, keep: str, outcome: str, threshold: float) -> list[tuple[int, bool]]:
    """(sample index, passed) of the samples of one prompt that `keep` keeps. A sample passes when its outcome part
    reaches the threshold and no part failed (an error is no verdict)."""
    passed = [not t.reward_failed and t.reward_parts.get(outcome, 0.0) >= threshold for t in trajs]
    if keep == "all":
        return list(enumerate(passed))
    winners = [j for j, p in enumerate(passed) if p]
    if keep == "best":
        winners = [max(winners, key=lambda j: (trajs[j].reward, -j))] if winners else []
    return [(j, True) for j in winners]


# -- the run ---------------------------------------------------------------------------------------------------------
def generate(cfg: dict) -> list[dict]:
    """Generate into generate.out (see the module docstring); returns the summary, one entry per (domain, mode)."""
    g = check_generate(cfg)
    chosen = dict(cfg["domains"])
    for spec in chosen.values():  # RL's checks refuse a config whose domains all have weight 0; here weight is moot
        if isinstance(spec, dict) and not float(spec.get("weight") or 0):
            spec["weight"] = 1.0
    model_path = prepare(cfg)  # the run's checks: domains, rewards, agent environments, model.path
    # a domain's weight is its share of RL's prompt mixture: one switched off there (weight 0, which prepare drops
    # after checking it, agent blocks completed in place) still generates here
    cfg["domains"] = chosen
    check_generators(g, cfg)
    # Nothing of the sampling is trained on: no kept sets or routes to record, no batch-invariant engine for the
    # trainer to match (algorithm.on_policy); k samples per prompt (1 is fine here)
    cfg["algorithm"]["keep_sampling_mask"] = cfg["algorithm"]["keep_routing"] = False
    cfg["algorithm"]["on_policy"] = "default"
    cfg["rollout"]["n_samples"] = int(g["k"])
    out = Output(Path(g["out"]), {**{k: g[k] for k in SETTINGS}, "generators": {
        f"{d}/{MODE_NAMES[m]}": generator_of(g, cfg, d, m) for d, spec in cfg["domains"].items()
        for m in thinking_modes(spec) or [None]}})

    by_generator: dict[str, list[tuple]] = defaultdict(list)  # path -> [(domain, mode, row indices to do)]
    rows_of: dict[str, list[dict]] = {}
    for d, spec in cfg["domains"].items():
        rows = load_domain_rows(d, spec["dataset"], required_fields(spec["rewards"]))
        rows_of[d] = rows[: g["max_prompts"]] if g.get("max_prompts") else rows
        for mode in thinking_modes(spec) or [None]:
            todo = [i for i in range(len(rows_of[d])) if (f"{d}-{i}", MODE_NAMES[mode]) not in out.done]
            if todo:
                by_generator[generator_of(g, cfg, d, mode)].append((d, mode, todo))
    if not by_generator:
        log.info("generate: every prompt of %s is done already", g["out"])
        out.finish()
        return out.summary()
    out.complete.unlink(missing_ok=True)

    if len(by_generator) > 1:
        # vLLM's in-process engine core keeps this process's CuMem allocator (sleep mode) after its engine is gone,
        # and the next generator's engine then fails to start on it: each engine core runs in a process of its own
        # (a tensor-parallel engine's core stays here, its GPU work is in vLLM's Ray workers)
        cfg["rollout"]["engine_core"] = "subprocess"
    composer = reward_composer(cfg, model_path)
    try:
        for path, units in by_generator.items():
            _run_generator(cfg, g, path, units, rows_of, composer, out)
    finally:
        composer.close()
    out.finish()
    return out.summary()


def _run_generator(cfg: dict, g: Mapping, path: str, units: list[tuple], rows_of: dict, composer, out: Output) -> None:
    """Every (domain, mode) unit of one generator model, batch by batch; the engine is released at the end."""
    from rollout.worker import RolloutWorker

    log.info("generate: loading generator %s", path)
    worker = RolloutWorker(cfg, resolve_model_path(path), 0)
    try:
        for d, mode, todo in units:
            total = len(rows_of[d])
            for start in range(0, len(todo), int(g["batch_prompts"])):
                batch = todo[start : start + int(g["batch_prompts"])]
                rows, records = _generate_batch(cfg, g, worker, path, d, mode, batch, rows_of[d], composer)
                out.add(rows, records)
                finished = sum(1 for i in range(total) if (f"{d}-{i}", MODE_NAMES[mode]) in out.done)
                log.info("generate: %s/%s [%s]: %d/%d prompts done (%d samples, %d kept in this call)", d,
                         MODE_NAMES[mode] or "default", path, finished, total, sum(r["samples"] for r in records),
                         len(rows))
    finally:
        for runner in worker._agents.values():
            runner.close()
        del worker
        gc.collect()  # the engine's memory (a vLLM engine's GPU memory with it) before the next generator loads
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _generate_batch(cfg: dict, g: Mapping, worker, path: str, d: str, mode: bool | None, batch: list[int],
                    rows: list[dict], composer) -> tuple[list[dict], list[dict]]:
    """One generate call for `batch` (row indices of domain d) in `mode`: (kept rows, progress records)."""
    spec = cfg["domains"][d]
    runner = worker._agents.get(d)
    system = spec["dataset"].get("system_prompt")
    requests, skipped = [], []
    for i in batch:
        req = {"group_id": f"gen-{d}-{i}-{MODE_NAMES[mode]}", "domain": d, "prompt_ids": [], "prompt_text": "",
               "sample": dict(rows[i]), "thinking": mode, "index": i}
        if runner is None:
            text, ids = render_prompt(worker.tokenizer, system, rows[i], cfg["data"].get("chat_template_kwargs") or {},
                                      mode)
            if len(ids) > int(cfg["data"]["max_prompt_tokens"]):
                log.warning("generate: %s row %d: prompt has %d tokens > data.max_prompt_tokens, skipped", d, i,
                            len(ids))
                skipped.append(i)
                continue
            req["prompt_ids"], req["prompt_text"] = ids, text
        requests.append(req)
    k = int(g["k"])
    # the seed's step: stable per (domain, mode, first prompt), so a call's samples do not depend on the calls before
    step = zlib.crc32(f"{d}/{MODE_NAMES[mode]}/{batch[0]}".encode()) % 100_000
    trajs = worker.generate(requests, step=step) if requests else []
    composer.score(trajs)
    outcome = spec["rewards"][0].get("label", spec["rewards"][0]["name"])
    tools = None
    if runner is not None:
        from rollout.tool_format import openai_tools

        tools = openai_tools(runner.tools)
    kept, records = [], []
    for n, req in enumerate(requests):
        group = trajs[n * k : (n + 1) * k]
        i, count = req["index"], 0
        for j, passed in select(group, g["keep"], outcome, float(g["pass_threshold"])):
            t = group[j]
            if runner is not None:
                # a domain with no mode set runs its episodes in agent.thinking's
                messages = episode_messages(t.episode["messages"], runner.cfg.thinking if mode is None else mode)
            else:
                messages = single_turn_messages(system, str(rows[i]["prompt"]), t.response_text, mode)
            if not any(m["role"] == "assistant" for m in messages):
                continue  # an episode that ended before its first turn: nothing to train on
            row = {"messages": messages, **({"tools": tools} if tools else {}), "domain": d,
                   "mode": MODE_NAMES[mode], "generator": path, "prompt_id": f"{d}-{i}", "sample_index": j,
                   "reward": t.reward, "parts": t.reward_parts, "passed": passed, "finish_reason": t.finish_reason,
                   # the exact tokens sampled (prompt, then response; loss_mask 1 on the generated ones): SFT can
                   # train on them token for token (rl/sft_data.py), e.g. where the template cannot render `tools`
                   "token_ids": [int(x) for x in t.prompt_ids] + [int(x) for x in t.response_ids],
                   "loss_mask": [0] * len(t.prompt_ids) + [int(x) for x in t.loss_mask_or_ones()]}
            kept.append(row)
            count += 1
        records.append({"prompt_id": f"{d}-{i}", "domain": d, "mode": MODE_NAMES[mode], "samples": len(group),
                        "kept": count, "reward_sum": sum(t.reward for t in group)})
    records += [{"prompt_id": f"{d}-{i}", "domain": d, "mode": MODE_NAMES[mode], "samples": 0, "kept": 0,
                 "reward_sum": 0.0} for i in skipped]
    return kept, records


def summary_lines(summary: list[dict]) -> list[str]:
    """One line per (domain, mode); mode "default" where the domain sets none."""
    return [f"{s['domain']}/{s['mode'] or 'default'}: {s['prompts']} prompts, {s['samples']} samples, "
            f"{s['kept']} kept, mean reward {'-' if s['mean_reward'] is None else format(s['mean_reward'], '.4f')}"
            for s in summary]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = compose(args)
        summary = generate(cfg)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    for line in summary_lines(summary):
        print(line, file=sys.stderr)
    print(f"-> {Path(cfg['generate']['out']) / 'data.jsonl'} (train on it: python -m launch.sft "
          f"algorithm.dataset.path={Path(cfg['generate']['out']) / 'data.jsonl'})", file=sys.stderr)
    return 0


# The guard matters: the reward process pool uses forkserver, whose workers import the main module.
if __name__ == "__main__":
    sys.exit(main())
