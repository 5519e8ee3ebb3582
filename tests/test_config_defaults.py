"""Issue 68, item 7 (design review R8): one default per key. A tool that builds a partial config (launch/score.py,
the judge's merged section, a test) gets the code's fallback for a key it lacks, so the code's fallback must be the
YAML's value. The code reads it from one constant (rl.config.ROLLOUT_DEFAULTS / TRAINER_DEFAULTS), which the YAML
must match; and no code reads a rollout or trainer key with a fallback of its own that differs from the YAML."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rl.config import ROLLOUT_DEFAULTS, TRAINER_DEFAULTS, engine_memory_share

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rollout", "trainer", "launch", "rl", "rewards")
# the names the code gives a section of the config (`rcfg = cfg["rollout"]`, `t = cfg["trainer"]`, ...)
SECTION_NAMES = {"rollout": {"rcfg", "r", "rollout"}, "trainer": {"tcfg", "t"}}
DEFAULTS = {"rollout": ROLLOUT_DEFAULTS, "trainer": TRAINER_DEFAULTS}
DEFAULTS_NAMES = {"ROLLOUT_DEFAULTS": "rollout", "TRAINER_DEFAULTS": "trainer", "D": "rollout"}

# Reads whose fallback differs from the YAML on purpose, or in files this change does not own (file, section.key)
KNOWN = {
    ("launch/score.py", "rollout.max_new_tokens"): "0: the budget the scored responses had is unknown (a length part "
                                                   "then needs its own max_new_tokens), not the smoke run's 48",
    ("rewards/worker.py", "rollout.max_new_tokens"): "as launch/score.py",
    ("rl/config.py", "trainer.micro_batch_memory"): "validation: an absent key is not checked",
    ("rl/config.py", "trainer.micro_batch_size"): "validation: a required key, an absent one is an error",
    ("rl/config.py", "trainer.pack_sequences"): "validation of algorithm.step_tokens, which needs it set to true",
    ("launch/placement.py", "rollout.tensor_parallel_size"): "only in an error message",
    ("launch/placement.py", "trainer.device"): "compared with 'cuda': absent acts as the YAML's auto",
}


def _yaml(path: str) -> dict:
    return yaml.safe_load((ROOT / "conf" / path).read_text())


def yaml_values() -> dict[str, list[dict]]:
    return {"rollout": [_yaml("rollout/vllm.yaml"), _yaml("rollout/hf.yaml")],
            "trainer": [_yaml("trainer/deepspeed.yaml")]}


def _section(node: ast.AST) -> str | None:
    """The config section `node` (the receiver of a `.get`) names, if it is recognisably one."""
    if isinstance(node, ast.Name):
        return next((s for s, names in SECTION_NAMES.items() if node.id in names), None)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in SECTION_NAMES:
        return node.slice.value  # cfg["rollout"], self.cfg["trainer"]
    if isinstance(node, ast.BoolOp) and isinstance(node.values[0], ast.Call):  # (cfg.get("rollout") or {})
        call = node.values[0]
        if (isinstance(call.func, ast.Attribute) and call.func.attr == "get" and call.args
                and isinstance(call.args[0], ast.Constant) and call.args[0].value in SECTION_NAMES):
            return call.args[0].value
    return None


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def divergent_reads(root: Path, yamls: dict[str, list[dict]]) -> list[tuple[str, int, str, str]]:
    """(file, line, section.key, why) for each read of a rollout / trainer key whose fallback is not the YAML's:
    `.get(key, default)` with a literal other than the YAML value (a `*_DEFAULTS[key]` default is checked by the
    other tests); `.get(key) or default` where the YAML value is truthy and differs; `.get(key)` (None) where the
    YAML value is truthy. Keys the YAMLs disagree on (hf / vllm: engine, num_gpus, ...) have no one default."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            source = path.read_text()
            tree = ast.parse(source)
            parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                        and node.args and isinstance(node.args[0], ast.Constant)
                        and isinstance(node.args[0].value, str)):
                    continue
                section, key = _section(node.func.value), node.args[0].value
                values = [y[key] for y in yamls.get(section, ()) if key in y]
                if section is None or not values or any(not _same(v, values[0]) for v in values):
                    continue
                want, where = values[0], (str(path.relative_to(root)), node.lineno, f"{section}.{key}")
                up = parent.get(node)
                if len(node.args) > 1:
                    default = node.args[1]
                    if (isinstance(default, ast.Subscript) and isinstance(default.value, ast.Name)
                            and DEFAULTS_NAMES.get(default.value.id) == section
                            and isinstance(default.slice, ast.Constant) and default.slice.value == key):
                        continue
                    try:
                        literal = ast.literal_eval(default)
                    except ValueError:
                        found.append((*where, f"default {ast.get_source_segment(source, default)}: not the YAML's "
                                              f"{want!r} nor {section.upper()}_DEFAULTS"))
                        continue
                    if not _same(literal, want):
                        found.append((*where, f"default {literal!r}, YAML {want!r}"))
                elif isinstance(up, ast.BoolOp) and isinstance(up.op, ast.Or) and up.values[0] is node:
                    if not want:  # the YAML's value falls through to the same fallback
                        continue
                    try:
                        literal = ast.literal_eval(up.values[1])
                    except ValueError:
                        literal = object()
                    if isinstance(up.values[1], ast.Subscript) and isinstance(up.values[1].value, ast.Name) and \
                            DEFAULTS_NAMES.get(up.values[1].value.id) == section:
                        continue
                    if not _same(literal, want):
                        found.append((*where, f"absent reads as `{ast.get_source_segment(source, up.values[1])}`, "
                                              f"YAML {want!r}"))
                elif want:  # absent reads as None (falsy), the YAML's value is truthy
                    found.append((*where, f"absent reads as None, YAML {want!r}"))
    return found


def test_the_code_defaults_are_the_yamls():
    yamls = yaml_values()
    for section, defaults in DEFAULTS.items():
        for key, value in defaults.items():
            having = [y for y in yamls[section] if key in y]
            assert having, f"{section}.{key}: a code default for a key no YAML of {section}/ has"
            for y in having:
                assert _same(y[key], value), f"{section}.{key}: the code's default {value!r}, the YAML's {y[key]!r}"
    assert set(ROLLOUT_DEFAULTS) <= set(yamls["rollout"][0])  # every one in conf/rollout/vllm.yaml


def test_no_code_reads_a_rollout_or_trainer_key_with_a_default_of_its_own():
    found = [f for f in divergent_reads(ROOT, yaml_values()) if (f[0], f[2]) not in KNOWN]
    assert not found, "reads whose fallback is not the YAML's value:\n" + "\n".join(
        f"  {file}:{line} {key}: {why}" for file, line, key, why in found)


def test_the_known_exceptions_are_still_there():
    """An exception that was fixed leaves KNOWN (so it cannot hide a new one in the same file)."""
    present = {(f[0], f[2]) for f in divergent_reads(ROOT, yaml_values())}
    assert set(KNOWN) - present == set(), f"fixed, remove from KNOWN: {sorted(set(KNOWN) - present)}"


@pytest.fixture(scope="module")
def vllm_rollout() -> dict:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="train", overrides=["rollout=vllm"]), resolve=True)
    return cfg["rollout"]


def test_a_partial_config_behaves_as_the_yaml(vllm_rollout):
    """What the old fallbacks got wrong: a vLLM rollout section without enable_sleep_mode / gpu_memory_utilization
    (rl/config.py, rollout/vllm_engine.py, launch/weight_sync.py read false / none; the YAML says true / 0.4)."""
    from launch.weight_sync import VLLMWeightSync

    partial = {k: vllm_rollout[k] for k in ("engine", "placement", "num_workers", "num_gpus")}
    assert engine_memory_share(partial) == engine_memory_share(vllm_rollout) == pytest.approx(0.4)
    trainer = {"num_processes": 1, "num_gpus": 0.5}
    full_sync = VLLMWeightSync({"rollout": vllm_rollout, "trainer": trainer}, [], [])
    partial_sync = VLLMWeightSync({"rollout": partial, "trainer": trainer}, [], [])
    assert partial_sync.sleep_level == full_sync.sleep_level == 2
    assert partial_sync.timeout_s == full_sync.timeout_s == 1800
