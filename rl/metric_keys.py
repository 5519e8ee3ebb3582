"""Every key a training step logs, with when it has a value and what it means: the table in README's "Metrics".

`python -m rl.metric_keys` prints the table; tests/test_metric_keys.py checks that the README holds exactly that
table, that every key the metric functions produce matches one row, and that a real run's keys (the README's main
job) match rows and cover every row the embedded default can log. A key added to the code without a row here fails
those tests, so the table cannot drift from what runs.

Placeholders: <d> a domain, <part> a reward part's label, <tool> one of an agent environment's tools,
<status> a tool call's status, <reason> an episode's termination reason, <piece> a part of the vLLM weight sync.

The rows are those of an RL run (algorithm.objective=grpo, which "every step" means); on-policy distillation
(algorithm.objective=distill) logs them and the rows marked with it; an SFT run
(algorithm.objective=sft) logs the rows marked SFT and the objective-free ones (step, entropy/*, grad_norm, lr,
time/step, time/train, the train throughput and perf rows, memory/*).

What a step without a value shows: `metrics.jsonl` holds every key on every step, null where the step has no value
for it (a domain that drew no prompt, a reference that was not run); W&B leaves nulls out, so its chart has a gap
there, and a key that is null on every step of a run (`kl/<d>` of a domain with `kl_coef` 0, `memory/*` on CPU,
`tis/*` with the engine's logprobs as pi_old) has no chart in W&B at all. The exceptions are marked "sparse":
counts that appear only on steps where they are not zero.
"""

from __future__ import annotations

import re

DISTILL = "algorithm.objective=distill"  # the rows only on-policy distillation logs (on every step of such a run)
DYNAMIC = "data.dynamic_sampling.enabled"  # the rows only a run with dynamic sampling logs (on every step of it)
# (pattern, when it has a value, meaning). `when`: "every step", or the condition; "null ..." says when it is null.
KEYS: list[tuple[str, str, str]] = [
    ("step", "every step", "the RL step (from 1); the x-axis of every chart"),
    ("reward/mean", "every step", "mean total reward (the weighted sum of a sample's parts) over the step's samples"),
    ("reward/std", "every step", "standard deviation of the total reward over the step's samples"),
    ("reward/<d>/mean", "null when the step drew no prompt of <d>", "mean total reward of the domain's samples"),
    ("reward/<d>/<part>", "null when the step drew no prompt of <d>", "mean unweighted score of one reward part"),
    ("reward/failed_frac", "every step", "share of samples with a reward part that raised or timed out (scored 0, "
     "trained with advantage 0 outside its group's baseline)"),
    ("reward/with_reason_frac", "every step", "share of samples scored with a reason: failures and expected zeros "
     "such as 'no code block'"),
    ("samples/<d>", "every step", "samples of the domain in the step (0 when it drew no prompt of it)"),
    ("prompt_length/mean", "every step", "mean prompt tokens"),
    ("response_length/mean", "every step", "mean generated tokens of a sample (tool output of an episode not counted)"),
    ("response_length/max", "every step", "most generated tokens of one sample"),
    ("response_length/truncated_frac", "every step", "share of samples cut at the token limit (finish reason length)"),
    ("response_length/<d>/mean", "null when the step drew no prompt of <d>", "mean generated tokens per domain"),
    ("mode/<d>/thinking/reward_mean", "null when the step drew no thinking-mode prompt of <d>; only for a domain "
     "whose thinking mode is set", "mean total reward of the domain's samples rendered in thinking mode"),
    ("mode/<d>/thinking/response_length_mean", "null when the step drew no thinking-mode prompt of <d>; only for a "
     "domain whose thinking mode is set", "mean generated tokens of those samples"),
    ("mode/<d>/non_thinking/reward_mean", "null when the step drew no non-thinking prompt of <d>; only for a domain "
     "whose thinking mode is set", "mean total reward of the domain's samples rendered in non-thinking mode"),
    ("mode/<d>/non_thinking/response_length_mean", "null when the step drew no non-thinking prompt of <d>; only for a "
     "domain whose thinking mode is set", "mean generated tokens of those samples"),
    ("advantage/abs_mean", "every step", "mean |advantage| over the step's samples (0: nothing to learn from)"),
    ("advantage/zero_variance_group_frac", "every step", "share of groups whose samples all got the same reward: "
     "their advantages are 0"),
    ("rollout/kept_set_cut_frac", "every step", "share of response tokens whose kept set (Keep Sampling Mask) the "
     "engine could not record completely; they are left out of the loss"),
    ("rollout/staleness", "every step", "weight updates between the sampling weights and the trained ones"),
    ("loss/pg", "every step", "policy-gradient loss, the mean over mini-batches"),
    ("loss/kl", "every step", "the KL term of the loss (beta times the K3 estimate), the mean over mini-batches"),
    ("kl/<d>", "null when the domain's kl_coef is 0 (its reference is not run) or it drew no prompt",
     "the domain's K3 KL estimate per sequence against the reference"),
    ("clip_frac", "every step", "share of loss tokens whose ratio was clipped"),
    ("entropy/kept_set", "every step", "entropy of the distribution the loss is under (the renormalised kept set with "
     "Keep Sampling Mask, else the full vocabulary)"),
    ("entropy/full_vocab", "every step", "entropy over the full vocabulary (what verl and slime call entropy; with "
     "the support head, over every 8th token)"),
    ("opsm/masked_frac", "every step", "share of sequences whose policy-gradient term off-policy sequence masking "
     "dropped"),
    ("opsm/<d>/masked_frac", "null when the step drew no prompt of <d>", "the same per domain"),
    ("mismatch/logprob_abs", "every step", "mean |log pi_old (engine) - log pi_theta (trainer)| before the step's "
     "first update"),
    ("mismatch/routing_frac", "every step", "share of MoE routing decisions the trainer's router would take "
     "differently (0 for dense models)"),
    ("tis/weight_mean", "null unless algorithm.old_logprobs=trainer", "mean truncated importance weight "
     "pi_old / pi_inference"),
    ("tis/clip_frac", "null unless algorithm.old_logprobs=trainer", "share of tokens at the importance-weight cap"),
    ("grad_norm", "every step", "gradient norm before clipping, the mean over optimizer steps"),
    ("lr", "every step", "learning rate of the step"),
    ("time/step", "every step", "seconds of the whole step but writing its metrics and checkpoint"),
    ("time/rollout", "every step", "seconds the loop waited for the rollout (only the collection when "
     "rollout.max_staleness=1)"),
    ("time/generate", "every step", "the rollout workers' seconds on the step's samples, also when that overlapped "
     "the step before"),
    ("time/reward", "every step", "scoring left after the last sample was generated"),
    ("time/backfill", DYNAMIC, "seconds of the step's backfill rounds (drawn, generated and scored while the loop "
     "waits; about 0 when the first round filled the step)"),
    ("time/ref", "every step", "seconds of the reference model's forward (0 when no sample has a KL term)"),
    ("time/train", "every step", "seconds of the policy update as the driver sees it: the call, or for an update "
     "submitted during the previous step (a dataset source's, launch/loop.py) the time from that step's results to "
     "this one's"),
    ("time/train_rank", "every step", "seconds a trainer rank spent in the update (the mean over ranks, the GPU's "
     "work included); time/train minus it is the dispatch (sending the samples to the ranks, their results back) "
     "or, for an update submitted a step ahead, the rank's wait between updates"),
    ("time/sync", "every step", "seconds of the weight sync to the rollout engines"),
    ("time/sync_<piece>", "vLLM only", "parts of the vLLM weight sync: wake (workers wake their weights), send (the "
     "trainer sends), send_rank (a rank's own share of it), finish (workers finish and wake the KV cache)"),
    ("time/payload_fetch", "rollout.payload_by_reference", "seconds a trainer rank waited for its samples' "
     "per-token arrays (logprobs, kept sets, routes) from the object store, the mean over ranks"),
    ("time/rollout_wait", "rollout.max_staleness=1, not on the last step", "the trainer's wait for the next "
     "rollout to end before the weight sync"),
    ("time/eval", "eval steps", "seconds of the held-out evaluation"),
    ("time/tools", "null when the step drew no prompt of an agent domain", "the slowest rollout worker's wall time "
     "in tool calls"),
    ("throughput/tokens_per_s", "every step", "generated tokens per second of the step"),
    ("throughput/rollout_tokens_per_s", "every step", "generated tokens per second of time/generate"),
    ("throughput/train_tokens_per_s", "every step", "prompt + response tokens per second of time/train"),
    ("throughput/ref_tokens_per_s", "steps that ran the reference", "prompt + response tokens per second of "
     "time/ref"),
    ("perf/train_tflops_per_gpu", "every step", "model FLOPs of the transformer body per second of time/train, per "
     "GPU (rl/flops.py)"),
    ("perf/ref_tflops", "steps that ran the reference", "the same for the reference's forward"),
    ("perf/mfu", "GPU, with a known peak (trainer.peak_tflops)", "perf/train_tflops_per_gpu over the GPU's dense "
     "bf16 peak"),
    ("perf/payload_fetched_mb", "rollout.payload_by_reference", "MB of per-token arrays the trainer ranks fetched "
     "from the object store, all ranks (the bytes that no longer pass through the driver and the reward workers)"),
    ("perf/gradient_checkpointing", "every step", "1 when the step recomputed activations (the share of ranks)"),
    ("perf/micro_batches", "every step", "micro-batches per mini-batch on a rank"),
    ("memory/trainer_free_gib", "null on CPU", "GPU memory the trainer could allocate as the train phase started "
     "(what micro_batch_size=auto sizes from), GiB, the mean over ranks"),
    ("memory/others_gib", "null on CPU", "GPU memory outside the trainer's allocator (a colocated vLLM asleep, the "
     "reference, CUDA contexts, NCCL buffers)"),
    ("memory/trainer_peak_gib", "null on CPU", "the most the train phase allocated"),
    ("data/skipped_long_prompts", "every step", "prompts skipped so far for being longer than "
     "data.max_prompt_tokens"),
    ("dynamic_sampling/rounds", DYNAMIC, "generation rounds of the step, the first included (at most "
     "data.dynamic_sampling.max_rounds)"),
    ("dynamic_sampling/extra_prompts", DYNAMIC, "prompts drawn beyond data.prompts_per_step (oversampling and "
     "backfill rounds)"),
    ("dynamic_sampling/dropped_groups", DYNAMIC, "groups generated in the step whose samples all got the same "
     "reward (not trained on unless they fill the step)"),
    ("dynamic_sampling/backfilled_frac", DYNAMIC, "share of the trained groups that came from backfill rounds"),
    ("dynamic_sampling/filled_groups", DYNAMIC, "zero-variance groups trained on (advantage 0) because the rounds "
     "ran out before the step held data.prompts_per_step groups with variance (0 normally)"),
    ("dynamic_sampling/reward_mean", DYNAMIC, "mean reward of every sample generated in the step, all rounds: the "
     "policy's reward, which reward/mean (of the trained samples only) no longer is"),
    ("episode/<d>/turns", "null when the step drew no prompt of agent domain <d>", "mean model turns per episode"),
    ("episode/<d>/tool_calls", "null when the step drew no prompt of agent domain <d>", "mean tool calls per "
     "episode"),
    ("episode/<d>/generated_tokens", "null when the step drew no prompt of agent domain <d>", "mean tokens the "
     "model generated per episode"),
    ("episode/<d>/tool_tokens", "null when the step drew no prompt of agent domain <d>", "mean tokens of tool "
     "results per episode"),
    ("episode/<d>/tool_latency_s", "null when the step drew no prompt of agent domain <d>", "mean seconds of one "
     "tool call"),
    ("episode/<d>/success", "null when the step drew no prompt of agent domain <d>", "mean verifier score of the "
     "episodes (the domain's environment's verifier)"),
    ("episode/<d>/context_resets", "null when the step drew no prompt of agent domain <d>", "mean context resets "
     "per episode (agent.context_strategy; 0 with none)"),
    ("episode/<d>/discarded_tokens", "null when the step drew no prompt of agent domain <d>", "mean context tokens "
     "per episode that its context resets dropped"),
    ("episode/<d>/termination/<reason>", "null when the step drew no prompt of agent domain <d>", "share of episodes "
     "that ended so: submitted, answer, max_turns, length, tool_timeout, error"),
    ("episode/<d>/calls/<tool>/<status>", "sparse: steps with such calls", "tool calls of that tool and status "
     "(ok, error, bad_args, unknown_tool, timeout, skipped) in the step; calls of tools the environment does not "
     "have count under the tool name _unknown"),
    ("loss/sft", "SFT", "per-token mean negative log-likelihood of the assistant's tokens (the mean over "
     "mini-batches)"),
    ("sft/tokens", "SFT", "loss tokens (assistant tokens) of the step"),
    ("sft/epoch", "SFT", "epochs of the dataset drawn so far (fractional)"),
    ("sft/truncated", "SFT", "conversations cut at algorithm.max_tokens so far"),
    ("sft/conversations", "SFT", "conversations trained in the step"),
    ("sft/row_fill", "SFT", "algorithm.step_tokens: the share of the step's packed rows its tokens fill"),
    ("sft/held_over", "SFT", "algorithm.step_tokens: drawn conversations that fit no row yet, kept for a later step"),
    ("time/data", "SFT", "seconds waiting for the step's conversations (drawn, rendered and tokenised on a thread "
                         "while the previous step trained; a run's first step draws its own)"),
    ("distill/reverse_kl", DISTILL, "mean over the loss tokens of the domains with a teacher of log pi_old - log "
     "pi_teacher: the sampled estimate of KL(student || teacher) per token (null when the step drew none of them)"),
    ("distill/<d>/reverse_kl", DISTILL, "the same for one domain (null for a domain without a teacher or without "
     "samples in the step)"),
    ("time/teacher", DISTILL, "seconds of the teachers' forwards"),
    ("eval/k", "eval steps", "samples per held-out prompt (eval.n_samples)"),
    ("eval/<d>/mean@k", "eval steps", "mean reward of all held-out samples of the domain"),
    ("eval/<d>/pass@k", "eval steps", "share of held-out prompts with at least one passing sample"),
    ("eval/<d>/pass@1", "eval steps", "share of passing held-out samples"),
    ("eval/<d>/prompts", "eval steps", "held-out prompts evaluated"),
]

_PLACEHOLDER = re.compile(r"<[a-z]+>")

# ------------------------------------------------------------------------------ key segments from model text
UNKNOWN_TOOL = "_unknown"  # the <tool> of every call of a tool the environment does not have
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")


def key_segment(name: object, known: bool = True, fallback: str = UNKNOWN_TOOL) -> str:
    """The one way a name the model wrote (a tool call's) becomes a segment of a metric key: the name itself only
    when it names something the run defined (`known`: a tool of the environment) and is a plain segment (ASCII
    letters, digits, "_", ".", "-"; at most 64 characters; not starting with "." so never "." or ".."), else
    `fallback`. A model inventing names (a million tries) must not invent keys, nor put "/", a newline or 10 000
    characters into one."""
    if known and isinstance(name, str) and _SEGMENT.fullmatch(name):
        return name
    return fallback


def tool_call_segments(call: dict) -> tuple[str, str]:
    """(<tool>, <status>) of `episode/<d>/calls/<tool>/<status>` for one call of an episode's record
    (rollout/agent.py: {tool, status, seconds, known}). `known` False (or status unknown_tool, for a record without
    it): the environment has no such tool, whether the call ran or was skipped."""
    status = call.get("status")
    known = call.get("known", status != "unknown_tool")
    return key_segment(call.get("tool"), bool(known)), key_segment(status, fallback="_other")


def _regex(pattern: str) -> re.Pattern:
    parts = _PLACEHOLDER.split(pattern)
    # <part> and <tool> are names of the user's choosing: one path segment each, like every placeholder.
    return re.compile("^" + "[^/]+".join(re.escape(p) for p in parts) + "$")


_COMPILED = [(pattern, _regex(pattern)) for pattern, _, _ in KEYS]


def row_of(key: str) -> str | None:
    """The pattern of KEYS that `key` is an instance of (the most specific when several match), else None."""
    hits = [pattern for pattern, rx in _COMPILED if rx.match(key)]
    return min(hits, key=lambda p: len(_PLACEHOLDER.findall(p))) if hits else None


def markdown_table() -> str:
    lines = ["| key | has a value | meaning |", "|---|---|---|"]
    code = lambda text: _PLACEHOLDER.sub(lambda m: f"`{m.group(0)}`", text)  # noqa: E731 - <d> is no HTML tag
    lines += [f"| `{pattern}` | {code(when)} | {code(meaning)} |" for pattern, when, meaning in KEYS]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
