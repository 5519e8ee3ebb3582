"""SFT (issue 35, first slice): the assistant-only loss mask of a rendered chat, the SFT loss against a reference
cross-entropy in float64, packed == padded, the dataset source's order and resume, the objective seam's metrics, the
config refusals, and `python -m launch.sft +experiment=sft` end to end (slow)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rl.config import ConfigError
from rl.losses import sft_loss
from rl.metrics import TrainStatSums, forward_sums, trainer_metrics
from rl.models import BUNDLED_DIR, load_causal_lm, load_tokenizer
from rl.sft_data import ConversationDataset, assistant_spans, drop_nulls, load_conversations, render_conversation
from rl.trajectory import Trajectory, collate
from trainer.forward import ForwardOut, forward_logprobs
from trainer.objectives import GRPO, OBJECTIVES, SFT

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = {"path": "bundled:sft.jsonl", "columns": {"messages": "messages", "tools": "tools"}}
LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "Look a key up.", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}
TOOL_CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is stored under alpha?"},
    {"role": "assistant", "content": "", "reasoning_content": "I should look it up.",
     "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": "{\"key\": \"alpha\"}"}}]},
    {"role": "tool", "content": "17"},
    {"role": "assistant", "content": "The value is 17."},
]


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of ones."""
    edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


# ------------------------------------------------------------------------------------------------- the loss mask
def test_the_mask_is_exactly_the_assistant_turns_with_a_tool_call_and_result(tiny_moe_path):
    """Embedded tokenizer (tool-aware template): the trained tokens are the two assistant turns, each from the token
    after `<|im_start|>assistant\\n` through its `<|im_end|>`: reasoning, the tool call, the answer. The system text
    with the tools, the user turn, the tool result and the newline after each `<|im_end|>` are masked."""
    tok = load_tokenizer(tiny_moe_path)
    r = render_conversation(tok, TOOL_CHAT, [LOOKUP])
    text, ids, mask = r.text, r.ids, r.loss_mask
    header, end = "<|im_start|>assistant\n", "<|im_end|>"
    want = []  # the character spans read off the rendered text itself
    at = 0
    while (at := text.find(header, at)) != -1:
        start = at + len(header)
        want.append((start, text.index(end, start) + len(end)))
        at = start
    assert len(want) == 2
    assert text[want[0][0]:want[0][1]] == ('<think>\nI should look it up.\n</think>\n\n<tool_call>\n{"name": "lookup", '
                                           '"arguments": {"key": "alpha"}}\n</tool_call><|im_end|>')
    assert text[want[1][0]:want[1][1]] == "The value is 17.<|im_end|>"
    runs = _runs(mask)
    assert len(runs) == 2
    im_start, im_end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    for (a, b), (ca, cb) in zip(runs, want):
        assert r.offsets[a] == ca and ids[b - 1] == im_end  # exact positions: first content token .. the <|im_end|>
        assert tok.decode(ids[a:b].tolist()) == text[ca:cb]
        h = int(np.flatnonzero(ids[:a] == im_start)[-1])  # the header's tokens, masked
        assert tok.decode(ids[h:a].tolist()) == header and mask[h:a].sum() == 0
        assert mask[b] == 0 and tok.decode([int(ids[b])]) == "\n"  # scaffolding after the turn
    # everything outside the runs, the tool result and the tool schemas included, is 0
    outside = np.ones(len(ids), bool)
    for a, b in runs:
        outside[a:b] = False
    assert mask[outside].sum() == 0
    masked_text = tok.decode(ids[outside].tolist())
    assert "<tool_response>\n17\n</tool_response>" in masked_text and '"name": "lookup", "description"' in masked_text
    # the sample: prompt = everything before the first trained token, response up to the last one
    ds = ConversationDataset([{"messages": TOOL_CHAT, "tools": [LOOKUP]}], tok, seed=0, max_tokens=4096)
    t = ds.next_batch(1)[0]
    assert t.inference_logprobs is None and t.domain == "sft"
    assert len(t.prompt_ids) == runs[0][0] and len(t.prompt_ids) + len(t.response_ids) == runs[1][1]
    assert np.array_equal(t.loss_mask, mask[runs[0][0]:runs[1][1]])


def test_the_mask_on_smollm2s_template(smollm2_path):
    """SmolLM2's own template (ChatML, a default system message, no tool support): the same rule gives its assistant
    turns; a tool call it would silently drop is refused instead."""
    tok = load_tokenizer(smollm2_path)
    chat = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "It is 4."},
            {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "It is 6."}]
    r = render_conversation(tok, chat)
    runs = _runs(r.loss_mask)
    assert [tok.decode(r.ids[a:b].tolist()) for a, b in runs] == ["It is 4.<|im_end|>", "It is 6.<|im_end|>"]
    assert "You are a helpful AI assistant named SmolLM" in r.text  # its default system turn, masked
    with pytest.raises(ValueError, match="does not render the assistant's tool_calls"):
        render_conversation(tok, [TOOL_CHAT[1], {**TOOL_CHAT[2], "reasoning_content": None}, TOOL_CHAT[3]])


def test_templates_that_drop_or_rewrite_turns_are_refused(tiny_moe_path):
    tok = load_tokenizer(tiny_moe_path)
    with pytest.raises(ValueError, match="does not render the row's tools"):  # a template that ignores tools=
        assistant_spans(_with_template(tok, "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                                            "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
                                            "assistant\n{% endif %}"), TOOL_CHAT[:2] + TOOL_CHAT[4:], [LOOKUP])
    # reasoning shown on the last message only (as templates that drop old reasoning do): the prefix differs
    last_only = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if loop.last and m.reasoning_content %}"
                 "<think>{{ m.reasoning_content }}</think>{% endif %}{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning_content": "r"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    with pytest.raises(ValueError, match="renders the conversation up to this turn differently"):
        assistant_spans(_with_template(tok, last_only), chat)
    with pytest.raises(ValueError, match="no assistant message"):
        assistant_spans(tok, chat[:1])


def _with_template(tok, template: str):
    import copy

    other = copy.deepcopy(tok)
    other.chat_template = template
    return other


def test_the_bundled_set_loads_exactly_and_leaves_the_embedded_tokenizer_alone(tiny_moe_path):
    rows = load_conversations(BUNDLED)
    assert len(rows) == 64 and sum("tools" in r for r in rows) == 8
    # rl/models.py trains the embedded tokenizer on the bundled files' top-level strings: this file adds none
    for line in (BUNDLED_DIR / "sft.jsonl").read_text().splitlines():
        assert all(isinstance(v, list) for v in json.loads(line).values())
    calls = [m for r in rows for m in r["messages"] if m.get("tool_calls")]
    assert len(calls) == 16 and all(isinstance(c["tool_calls"][0]["function"]["arguments"], str) for c in calls)
    tok = load_tokenizer(tiny_moe_path)
    for r in rows:  # every row renders, with something to train on
        assert render_conversation(tok, r["messages"], r.get("tools")).loss_mask.sum() > 0
    # Arrow-backed datasets fill absent keys with None; dropped before rendering
    assert drop_nulls({"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "x", "a": None}}]}) \
        == {"role": "assistant", "tool_calls": [{"function": {"name": "x"}}]}


# ------------------------------------------------------------------------------------------------------ the loss
def _sft_samples(path: str, n: int = 4) -> list[Trajectory]:
    rows = load_conversations(BUNDLED)
    tool = [r for r in rows if "tools" in r][:1]
    two_turn = [r for r in rows if sum(m["role"] == "assistant" for m in r["messages"]) == 2 and "tools" not in r][:1]
    plain = [r for r in rows if "tools" not in r and r not in two_turn]
    ds = ConversationDataset(tool + two_turn + plain[: n - 2], load_tokenizer(path), seed=0, max_tokens=4096)
    return [ds.sample(i, 0) for i in range(n)]


def test_sft_loss_equals_the_reference_cross_entropy_over_assistant_tokens(tiny_dense_path):
    """float64: the trainer's forward + `sft_loss` (per-token mean over the batch's loss tokens) equals HF-style
    cross-entropy with labels = the ids on assistant tokens and -100 elsewhere, summed over the conversations
    in an explicit loop and divided by their loss tokens; the gradients agree too."""
    trajs = _sft_samples(tiny_dense_path)
    model = load_causal_lm(tiny_dense_path, "float32", "sdpa").double().train()
    batch = collate(trajs, pad_id=0)
    assert batch.inference_logprobs is None
    out = forward_logprobs(model, batch, temperature=1.0)
    n_tok = int(batch.loss_mask.sum())
    loss, stats = sft_loss(out.logprobs, batch.loss_mask, norm_tokens=n_tok)
    loss.backward()
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    total, count = torch.zeros((), dtype=torch.float64), 0
    for t in trajs:
        ids = torch.tensor(np.concatenate([t.prompt_ids, t.response_ids]), dtype=torch.long)
        labels = torch.full_like(ids, -100)
        assistant = np.concatenate([np.zeros(len(t.prompt_ids)), t.loss_mask]) > 0
        labels[torch.from_numpy(assistant)] = ids[torch.from_numpy(assistant)]
        logits = model(input_ids=ids[None]).logits[0].double()
        total = total + F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="sum")
        count += int(assistant.sum())
    reference = total / count
    reference.backward()
    assert count == n_tok == int(stats["tok_sum"])
    assert abs(float(loss.detach()) - float(reference.detach())) < 1e-10
    assert float(stats["nll_loss"]) == float(loss.detach())
    for a, b in zip(ours, (p.grad for p in model.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_sft_loss_edges():
    lp = torch.tensor([-1.0, float("-inf"), -3.0], dtype=torch.float64, requires_grad=True)
    loss, stats = sft_loss(lp, torch.tensor([1.0, 0.0, 1.0]), norm_tokens=4)  # a masked -inf contributes nothing
    assert float(loss.detach()) == 1.0 and float(stats["tok_sum"]) == 2
    loss.backward()
    assert lp.grad.tolist() == [-0.25, 0.0, -0.25]
    empty, _ = sft_loss(lp, torch.zeros(3), norm_tokens=0)  # no loss token in the mini-batch: 0, not 0/0
    assert float(empty.detach()) == 0.0
    one, stats = sft_loss(lp, torch.tensor([0.0, 0.0, 1.0]), norm_tokens=1)  # one loss token: its whole loss
    assert float(one.detach()) == 3.0
    assert all(not v.requires_grad for v in stats.values())  # stats are summed for logging, never backpropagated


@pytest.mark.parametrize("family", ["tiny_dense_path", "tiny_moe_path"])
def test_packed_sft_equals_padded_also_cut_by_a_token_budget(family, request):
    """trainer.pack_sequences: the conversations back to back in one row give the padded batch's SFT loss and
    gradient; cut into micro-batches by a token budget (trainer.micro_batch_tokens), the micro-batch losses
    (normalised by the whole batch's tokens) sum to the same loss and gradient."""
    from rl.batching import micro_batch_count, micro_batches

    path = request.getfixturevalue(family)
    moe = family == "tiny_moe_path"
    trajs = _sft_samples(path)
    model = load_causal_lm(path, "float32", "sdpa").train()
    model = model if moe else model.double()  # the MoE's grouped expert matmul runs in float32 only
    tol = 1e-5 if moe else 1e-10
    n_tok = int(sum(t.loss_mask.sum() for t in trajs))

    def run(parts, packed):
        model.zero_grad()
        total = 0.0
        for part in parts:
            batch = collate(part, pad_id=0, packed=packed)
            loss, _ = sft_loss(forward_logprobs(model, batch, temperature=1.0).logprobs, batch.loss_mask,
                               norm_tokens=n_tok)
            loss.backward()
            total += float(loss)
        return total, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    padded, g_pad = run([trajs], packed=False)
    packed, g_pack = run([trajs], packed=True)
    budget = 900
    k = micro_batch_count(trajs, budget, "packed")
    cut = micro_batches(trajs, k, "packed")
    assert k > 1 and max(sum(t.num_tokens for t in p) for p in cut) <= max(budget, max(t.num_tokens for t in trajs))
    micro, g_micro = run(cut, packed=True)
    assert abs(packed - padded) < tol and abs(micro - padded) < tol
    torch.testing.assert_close(g_pack, g_pad, rtol=tol * 10, atol=tol / 10)
    torch.testing.assert_close(g_micro, g_pad, rtol=tol * 10, atol=tol / 10)


# --------------------------------------------------------------------------------- the objective seam, metrics
def test_the_objectives_declare_their_source_needs_and_keys():
    assert OBJECTIVES["grpo"] is GRPO and OBJECTIVES["sft"] is SFT
    assert GRPO.source == "rollouts" and {"inference_logprobs", "advantages", "reference"} <= GRPO.needs
    assert SFT.source == "dataset" and not SFT.needs
    batch = collate([Trajectory(uid="a", group_id="a", domain="sft", prompt_ids=[1, 2], response_ids=[3, 4, 5],
                                inference_logprobs=None, loss_mask=np.array([1, 1, 0]))], pad_id=0)
    logprobs = torch.tensor([-1.0, -2.0, -9.0])
    loss, stats = SFT.loss(logprobs, batch, {}, (1, 2))
    sums = TrainStatSums()
    out = ForwardOut(logprobs, torch.full((3,), 0.5), torch.full((3,), 0.7))
    sums.add(forward_sums(batch, out, (0, 0), first_minibatch=True))
    sums.add(SFT.sums(batch, stats))
    m = trainer_metrics([sums.totals()], [], 1, SFT.metrics)
    assert m["loss/sft"] == pytest.approx(1.5) and m["sft/tokens"] == 2.0
    assert m["entropy/kept_set"] == pytest.approx(0.5) and m["entropy/full_vocab"] == pytest.approx(0.7)
    # no GRPO key and no train/inference mismatch (no engine sampled these): the objective owns its keys
    assert not any(k.startswith(("loss/pg", "clip_frac", "opsm/", "kl/", "tis/", "mismatch/")) for k in m)


def test_a_batch_holds_samples_of_one_source():
    sampled = Trajectory(uid="a", group_id="a", domain="math", prompt_ids=[1], response_ids=[2], inference_logprobs=[-1.0])
    row = Trajectory(uid="b", group_id="b", domain="sft", prompt_ids=[1], response_ids=[2], inference_logprobs=None)
    with pytest.raises(ValueError, match="one batch holds samples of one source"):
        collate([sampled, row], pad_id=0)
    with pytest.raises(ValueError, match="inference logprobs"):
        Trajectory(uid="c", group_id="c", domain="math", prompt_ids=[1], response_ids=[2], inference_logprobs=[])


# ----------------------------------------------------------------------------------------- the dataset source
def test_the_dataset_order_is_seeded_by_epoch_and_resumes_from_its_state(tiny_moe_path):
    tok = load_tokenizer(tiny_moe_path)
    rows = load_conversations(BUNDLED)[:10]

    def draw(ds, steps):
        return [[t.uid for t in ds.next_batch(4)] for _ in range(steps)]

    a = ConversationDataset(rows, tok, seed=3, max_tokens=4096)
    straight = draw(a, 6)  # 24 rows: two epochs and a bit, each epoch every row once in its own order
    flat = [u for b in straight for u in b]
    epoch0, epoch1 = [u.split("-")[1] for u in flat[:10]], [u.split("-")[1] for u in flat[10:20]]
    assert sorted(epoch0) == sorted(epoch1) == sorted(map(str, range(10))) and epoch0 != epoch1
    assert all(u.endswith("-e0") for u in flat[:10]) and all(u.endswith("-e2") for u in flat[20:])
    b = ConversationDataset(rows, tok, seed=3, max_tokens=4096)
    draw(b, 2)
    state = json.loads(json.dumps(b.state_dict()))  # as a checkpoint's state.json holds it
    c = ConversationDataset(rows, tok, seed=3, max_tokens=4096)
    c.load_state_dict(state)
    assert draw(c, 4) == straight[2:] and c.epoch == pytest.approx(2.4)
    assert draw(ConversationDataset(rows, tok, seed=4, max_tokens=4096), 1) != straight[:1]


def test_packed_steps_train_every_row_once_and_resume_with_the_rows_held_over(tiny_moe_path):
    """algorithm.step_tokens: each step's conversations fill its packed rows (never over the budget); a row that fits
    none waits for the next step, so over the run every row is trained once an epoch, none lost or twice; a
    checkpoint holds the waiting rows, and a resumed run draws exactly the steps a straight run does."""
    from rl.batching import micro_batch_count

    tok = load_tokenizer(tiny_moe_path)
    rows = load_conversations(BUNDLED)
    sizes = [ConversationDataset([r], tok, seed=0, max_tokens=4096).next_batch(1)[0].num_tokens for r in rows]
    n_rows, cap = 2, max(sizes) + 40  # a few conversations a row: some must wait

    def draw(ds, steps):
        out = []
        for _ in range(steps):
            step = ds.next_packed(n_rows, cap)
            assert micro_batch_count(step, cap, "packed") <= n_rows
            out.append([t.uid for t in step])
        return out

    a = ConversationDataset(rows, tok, seed=3, max_tokens=4096)
    straight = draw(a, 40)
    flat = [u for b in straight for u in b]
    assert len(flat) == len(set(flat))  # no row twice
    epoch0 = [u for u in flat if u.endswith("-e0")]
    assert sorted(int(u.split("-")[1]) for u in epoch0) == list(range(len(rows)))  # every row of epoch 0, once
    b = ConversationDataset(rows, tok, seed=3, max_tokens=4096)
    waits = []
    for _ in range(20):
        draw(b, 1)
        waits.append(len(b.state_dict()["carry"]))
    k = max(i for i, w in enumerate(waits) if w)  # resume after a step that left rows waiting (fails if none did)
    c = ConversationDataset(rows, tok, seed=3, max_tokens=4096)
    draw(c, k + 1)
    state = json.loads(json.dumps(c.state_dict()))
    assert state["carry"]
    d = ConversationDataset(rows, tok, seed=3, max_tokens=4096)
    d.load_state_dict(state)
    assert draw(d, 40 - k - 1) == straight[k + 1:]
    # resumed without step_tokens: the rows held over come first, none skipped
    e = ConversationDataset(rows, tok, seed=3, max_tokens=4096)
    e.load_state_dict(state)
    held = [[index, epoch] for index, epoch in state["carry"]]
    got = e.next_batch(len(held) + 2)
    assert [[t.sample["index"], t.sample["epoch"]] for t in got[:len(held)]] == held and not e.carry


def test_the_dataset_source_checkpoints_the_rows_after_its_own_step_not_the_prefetched_one(tiny_moe_path):
    """DatasetSource draws the next step on a thread while this one trains; its state is the position (and the rows
    held over) right after the step it handed out, so a source restored from it hands out the same next steps."""
    from launch.config import compose
    from launch.sources import DatasetSource

    cfg = compose(["+experiment=sft", "algorithm.samples_per_step=null", "algorithm.step_tokens=1024",
                   "trainer.micro_batch_tokens=512", "algorithm.max_tokens=512"])
    tok = load_tokenizer(tiny_moe_path)
    straight = DatasetSource(cfg, tok)
    straight.start(None, None, 12)
    uids = [[t.uid for t in straight.take(step, {}).trajs] for step in range(1, 13)]
    for cut in (2, 5):
        src = DatasetSource(cfg, tok)
        src.start(None, None, 12)
        for step in range(1, cut + 1):
            src.take(step, {})  # the next step is being drawn on the thread meanwhile
        state = json.loads(json.dumps(src.state_dict()))
        resumed = DatasetSource(cfg, tok)
        resumed.start(None, None, 12)
        resumed.load_state_dict(state)
        assert [[t.uid for t in resumed.take(step, {}).trajs] for step in range(cut + 1, 13)] == uids[cut:]


def test_long_conversations_are_cut_and_rows_without_assistant_tokens_skipped(tiny_moe_path):
    tok = load_tokenizer(tiny_moe_path)
    long_row = {"messages": [{"role": "user", "content": "hi " * 200}, {"role": "assistant", "content": "yes"}]}
    ok = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a b c d e f g"}]}
    ds = ConversationDataset([ok, long_row], tok, seed=0, max_tokens=40)
    got = ds.next_batch(3)
    assert [t.sample["index"] for t in got] == [0, 0, 0] and ds.skipped >= 1 and ds.truncated >= 1
    assert all(t.num_tokens <= 40 for t in got)
    cut = ConversationDataset([{"messages": ok["messages"] * 2}], tok, seed=0, max_tokens=18).next_batch(1)[0]
    assert cut.num_tokens <= 18 and cut.loss_mask.sum() > 0  # the first turn is kept, the rest cut off
    from rl.config import ConfigError

    with pytest.raises(ConfigError, match="no row has an assistant token"):
        ConversationDataset([ok, long_row], tok, seed=0, max_tokens=5).next_batch(1)
    with pytest.raises(ConfigError, match=r"algorithm\.dataset: row 0: .*no assistant message"):
        ConversationDataset([{"messages": [{"role": "user", "content": "x"}]}], tok, seed=0, max_tokens=40)


# ------------------------------------------------------------------------------------------------- the config
def test_sft_config_and_its_refusals():
    from launch.config import check_config, compose
    from launch.sft import with_sft
    from rl.batching import step_samples
    from rl.config import ConfigError, needs_reference

    cfg = compose(["+experiment=sft"])
    check_config(cfg)
    assert cfg["algorithm"]["objective"] == "sft" and cfg["domains"] == {} and not needs_reference(cfg)
    assert step_samples(cfg) == 16
    both = compose(["algorithm=sft", "+experiment=mixed_rl"])  # RL's domains are dropped for SFT
    check_config(both)
    assert both["domains"] == {} and not needs_reference(both)
    with pytest.raises(ConfigError, match=r"algorithm\.objective=sft trains on a dataset: .*algorithm=sft"):
        check_config(compose(["+experiment=mixed_rl", "algorithm.objective=sft"]))
    with pytest.raises(ConfigError, match=r"algorithm\.samples_per_step = 10 samples per step must split evenly"):
        check_config(compose(["+experiment=sft", "algorithm.samples_per_step=10", "trainer.mini_batches=4"]))
    with pytest.raises(ConfigError, match=r"algorithm\.dataset\.columns must map at least `messages`"):
        check_config(compose(["+experiment=sft", "~algorithm.dataset.columns.messages"]))
    packed = ["+experiment=sft", "algorithm.samples_per_step=null", "algorithm.step_tokens=8192"]
    cfg = compose(packed)
    check_config(cfg)
    assert step_samples(cfg) == 4  # 8192 tokens in rows of trainer.micro_batch_tokens=2048
    with pytest.raises(ConfigError, match=r"step_tokens and algorithm\.samples_per_step both set"):
        check_config(compose(["+experiment=sft", "algorithm.step_tokens=8192"]))
    with pytest.raises(ConfigError, match=r"step_tokens=5000 must be a multiple of trainer\.micro_batch_tokens=2048"):
        check_config(compose([*packed, "algorithm.step_tokens=5000"]))
    with pytest.raises(ConfigError, match=r"needs trainer\.micro_batch_size=auto, trainer\.pack_sequences=true"):
        check_config(compose([*packed, "trainer.pack_sequences=false"]))
    with pytest.raises(ConfigError, match=r"max_tokens=4096 is over trainer\.micro_batch_tokens=2048"):
        check_config(compose([*packed, "algorithm.max_tokens=4096"]))
    for wrong in ("trainer.pack_sequences=auto", "trainer.micro_batch_size=8"):  # auto may resolve to padded rows
        with pytest.raises(ConfigError, match=r"needs trainer\.micro_batch_size=auto, trainer\.pack_sequences=true"):
            check_config(compose([*packed, wrong]))
    with pytest.raises(ConfigError, match=r"4 packed rows .* fewer than trainer\.mini_batches \* trainer\.num_processes = 8"):
        check_config(compose([*packed, "trainer.mini_batches=8"]))
    assert with_sft(["+experiment=sft"]) == ["algorithm=sft", "+experiment=sft"]
    assert with_sft(["algorithm=grpo", "x=1"]) == ["algorithm=grpo", "x=1"]


# ----------------------------------------------------------------------------------------------- end to end
def _launch_sft(run_dir: Path, *overrides: str) -> list[dict]:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "launch.sft", "+experiment=sft", f"run_dir={run_dir}",
                           "logger.progress_bar=false", *overrides], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        log = run_dir / "train.log"
        worker = log.read_text(errors="replace").splitlines()[-60:] if log.exists() else ["(no train.log)"]
        pytest.fail(f"launch.sft exited {proc.returncode}\n" + "\n".join(proc.stderr.splitlines()[-60:]) + "\n---\n"
                    + "\n".join(worker), pytrace=False)
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_launch_sft_learns_checkpoints_and_resumes_on_the_same_data(tmp_path):
    """`python -m launch.sft +experiment=sft` on CPU: loss/sft falls, the last checkpoint is an HF model, no rollout
    or reward worker starts; 2 steps then a resume to 4 equal a straight run of 4 (the same conversations in the
    same order: the same losses and the same data position)."""
    common = ["trainer.save_every=2"]
    straight = _launch_sft(tmp_path / "a", *common, "trainer.total_steps=4")
    assert [r["step"] for r in straight] == [1, 2, 3, 4]
    assert straight[-1]["loss/sft"] < straight[0]["loss/sft"] - 0.3
    for r in straight:
        assert r["sft/tokens"] > 0 and r["throughput/train_tokens_per_s"] > 0 and r["sft/epoch"] == r["step"] / 4
        assert not any(k.startswith(("time/rollout", "time/sync", "reward/", "loss/pg", "mismatch/")) for k in r)
        from rl.metric_keys import row_of

        assert [k for k in r if row_of(k) is None] == []  # every key has its row in the README's table
    log = (tmp_path / "a" / "train.log").read_text()
    assert "RolloutWorker" not in log and "RewardWorker" not in log
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "checkpoints" / "step_000004" / "hf")
    _launch_sft(tmp_path / "b", *common, "trainer.total_steps=2")
    resumed = _launch_sft(tmp_path / "b", *common, "trainer.total_steps=4", "trainer.resume=auto")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(straight, resumed):
        assert abs(a["loss/sft"] - b["loss/sft"]) < 1e-6 and a["sft/tokens"] == b["sft/tokens"], a["step"]
    state = lambda run: json.loads((run / "checkpoints" / "step_000004" / "state.json").read_text())  # noqa: E731
    assert state(tmp_path / "a") == state(tmp_path / "b") == {"step": 4, "data": {"cursor": [1, 0], "truncated": 0,
                                                                                  "skipped": 0, "carry": []}}


@pytest.mark.slow
def test_launch_sft_with_packed_steps_runs_their_rows_and_resumes_with_the_rows_held_over(tmp_path):
    """`launch.sft` with algorithm.step_tokens: every step runs exactly step_tokens / micro_batch_tokens
    micro-batches, filled near full; a run cut after step 2 (rows held over in its checkpoint) and resumed trains
    step 3 on the same conversations as a straight run."""
    common = ["algorithm.samples_per_step=null", "algorithm.step_tokens=4096", "trainer.micro_batch_tokens=1024",
              "algorithm.max_tokens=1024", "trainer.save_every=2"]
    straight = _launch_sft(tmp_path / "a", *common, "trainer.total_steps=3")
    for r in straight:
        assert r["perf/micro_batches"] == 4 and 0.9 < r["sft/row_fill"] <= 1, r
    assert len({r["sft/conversations"] for r in straight}) > 1  # the count follows the rows, not a fixed number
    state = json.loads((tmp_path / "a" / "checkpoints" / "step_000002" / "state.json").read_text())
    assert state["data"]["carry"]  # the resume below starts with rows waiting
    _launch_sft(tmp_path / "b", *common, "trainer.total_steps=2")
    resumed = _launch_sft(tmp_path / "b", *common, "trainer.total_steps=3", "trainer.resume=auto")
    a, b = straight[-1], resumed[-1]
    assert b["step"] == 3 and abs(a["loss/sft"] - b["loss/sft"]) < 1e-6
    assert (a["sft/tokens"], a["sft/conversations"]) == (b["sft/tokens"], b["sft/conversations"])


def test_rows_with_the_sampled_token_ids_train_on_exactly_those(tiny_moe_path, tmp_path):
    """launch.generate's rows carry the tokens the generator sampled: SFT trains on them token for token (no
    template; how SmolLM2's agent episodes, whose tools its template cannot render, are trained), and refuses ids of
    another vocabulary or a mask of another length."""
    tok = load_tokenizer(tiny_moe_path)
    ids = tok("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello there<|im_end|>")["input_ids"]
    mask = [0] * 8 + [1] * (len(ids) - 8)
    row = {"messages": [{"role": "user", "content": "not rendered"}], "token_ids": ids, "loss_mask": mask}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    rows = load_conversations({"path": str(path), "columns": {"messages": "messages", "token_ids": "token_ids",
                                                              "loss_mask": "loss_mask"}})
    (t,) = ConversationDataset(rows, tok, seed=0, max_tokens=512).next_batch(1)
    assert t.prompt_ids.tolist() == ids[:8] and t.response_ids.tolist() == ids[8:]
    assert t.loss_mask.tolist() == [1.0] * (len(ids) - 8) and t.response_text.endswith("hello there<|im_end|>")
    with pytest.raises(ConfigError, match="outside the policy's vocabulary"):
        ConversationDataset([{**row, "token_ids": ids[:-1] + [len(tok) + 5]}], tok, seed=0, max_tokens=512)
    with pytest.raises(ConfigError, match="one length"):
        ConversationDataset([{**row, "loss_mask": mask[:-1]}], tok, seed=0, max_tokens=512)


class _RecordingCluster:
    """The loop's view of the trainer ranks, recording what it sends and when it waits."""

    def __init__(self):
        self.events: list[tuple] = []

    def submit_train(self, minibatches):
        self.events.append(("submit", [t.uid for mb in minibatches for t in mb]))
        return [len(self.events)]

    def train_results(self, submitted):
        self.events.append(("wait", submitted[0]))
        return [{}]


def _sft_source(tiny_moe_path, total: int):
    """A started DatasetSource of 3 conversations a step, and the loop's split of a step's samples (one mini-batch)."""
    from launch.config import compose
    from launch.sources import DatasetSource
    from rl.batching import minibatches

    cfg = compose(["+experiment=sft", "algorithm.samples_per_step=3"])
    src = DatasetSource(cfg, load_tokenizer(tiny_moe_path))
    src.start(None, None, total)
    return src, lambda trajs, step: minibatches(trajs, 1, cfg["seed"], step)


def test_a_dataset_sources_next_update_is_submitted_behind_this_one_but_not_past_a_checkpoint(tiny_moe_path):
    """`launch.loop.update`: with a dataset source the next step's update is sent before this step's results are
    awaited (the ranks go on without the driver's round trip), on exactly the samples that step's `take` returns;
    never after a step that checkpoints (its state must be saved first) nor past the last step. A rollout source
    never submits ahead."""
    from launch.loop import update
    from launch.sources import RolloutSource

    (src, split), cluster = _sft_source(tiny_moe_path, 4), _RecordingCluster()
    queued, taken = None, {}
    for step in range(1, 5):
        samples = src.take(step, {})
        taken[step] = sorted(t.uid for t in samples.trajs)
        _, queued = update(cluster, src, split, samples, step, queued, checkpoint_after=step == 2)
    assert queued is None
    kinds = [e[0] for e in cluster.events]
    # step 1 sends 1 and 2, then waits for 1; step 2 (checkpointed) only waits; step 3 sends 3 and 4, ...
    assert kinds == ["submit", "submit", "wait", "wait", "submit", "submit", "wait", "wait"]
    sent = [sorted(e[1]) for e in cluster.events if e[0] == "submit"]
    assert sent == [taken[1], taken[2], taken[3], taken[4]]
    waited = [e[1] for e in cluster.events if e[0] == "wait"]
    assert waited == [1, 2, 5, 6]  # each step's results are its own submission's
    assert RolloutSource.next_step_samples(None) is None


def test_a_failed_draw_of_the_next_step_leaves_this_steps_update_and_fails_the_next_take(tiny_moe_path):
    """The next step's conversations fail to render on the data thread: this step's update is still collected (and
    can be logged and checkpointed); the error comes from the next step's `take`, as without the ahead submission."""
    from launch.loop import update

    (src, split), cluster = _sft_source(tiny_moe_path, 4), _RecordingCluster()
    samples = src.take(1, {})
    src.next.result()  # let the thread's draw of step 2 finish, then replace it by a failed one
    from concurrent.futures import Future

    failed = Future()
    failed.set_exception(ValueError("row 7: not a conversation"))
    src.next = failed
    sums, queued = update(cluster, src, split, samples, 1, None, checkpoint_after=False)
    assert sums == [{}] and queued is None and [e[0] for e in cluster.events] == ["submit", "wait"]
    with pytest.raises(ValueError, match="row 7"):
        src.take(2, {})
