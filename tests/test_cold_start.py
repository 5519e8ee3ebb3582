"""Cold start (issue 37): benchmarks/cold_start.py's reading of a run, a run of it on the CPU, and the GGUF
conversion that a fresh machine pays before its first step (each file parsed once)."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import cold_start  # noqa: E402

# vLLM 0.26's start-up lines of two instances on one GPU (the second loads the first's compiled graph), as they
# came out of a smol_math run's train.log on an H200
VLLM_LOG = """\
(EngineCore pid=3810) INFO 11-27 08:03:30 [default_loader.py:430] Loading weights took 0.10 seconds
(EngineCore pid=3810) INFO 11-27 08:03:31 [model_runner.py:305] Model loading took 0.26 GiB and 1.961977 seconds
(EngineCore pid=3810) INFO 11-27 08:03:35 [backends.py:1155] Dynamo bytecode transform time: 9.16 s
(EngineCore pid=3810) INFO 11-27 08:03:37 [monitor.py:53] torch.compile took 28.88 s in total
(EngineCore pid=3810) INFO 11-27 08:03:44 [model_runner.py:747] Graph capturing finished in 6 secs, took 0.39 GiB
(EngineCore pid=3810) INFO 11-27 08:03:45 [core.py:340] init engine (profile, create kv cache, warmup model) took 57.22 s (compilation: 28.88 s)
(EngineCore pid=3968) INFO 11-27 08:04:19 [default_loader.py:430] Loading weights took 0.11 seconds
(EngineCore pid=3968) INFO 11-27 08:04:26 [backends.py:292] Directly load the compiled graph(s) for compile range (1, 16384) from the cache, took 1.945 s
(EngineCore pid=3968) INFO 11-27 08:04:26 [monitor.py:53] torch.compile took 5.96 s in total
(EngineCore pid=3968) INFO 11-27 08:04:34 [core.py:340] init engine (profile, create kv cache, warmup model) took 14.06 s (compilation: 5.96 s)
"""


def test_vllm_start_up_phases_are_read_per_instance_from_the_log():
    phases = cold_start.vllm_phases(VLLM_LOG)
    assert phases["load_weights"] == [0.10, 0.11]
    assert phases["model_loading"] == [1.961977]
    assert phases["dynamo"] == [9.16]
    assert phases["compile"] == [28.88, 5.96]
    assert phases["graph_capture"] == [6.0]
    assert phases["init_engine"] == [57.22, 14.06]
    assert phases["compile_cache_hits"] == [1.0]
    assert cold_start.vllm_phases("no vLLM here") == {}


def test_every_cache_of_a_run_is_under_the_benchmarks_own_folder(tmp_path):
    env = cold_start.cache_env(tmp_path)
    assert set(env) == {"MIXRL_CACHE", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",
                        "PYTHONPYCACHEPREFIX"}
    assert all(Path(p).parent == tmp_path / "caches" for p in env.values())
    cmd = cold_start.command("smol_math", tmp_path / "run", ["rollout.enforce_eager=true"])
    assert "trainer.total_steps=1" in cmd and "eval.every=0" in cmd and cmd[-1] == "rollout.enforce_eager=true"


def test_an_installed_run_compiles_the_packages_bytecode_into_its_own_cache_first(tmp_path):
    """`installed`: the bytecode a plain pip install writes, compiled into the run's emptied cache (never beside the
    packages), timed apart from the run; a file that does not compile is skipped."""
    pkg = tmp_path / "site" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 1\n")
    (pkg / "broken.py").write_text("def (:\n")
    env = {**os.environ, **cold_start.cache_env(tmp_path / "out")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    seconds = cold_start.compile_bytecode(env, [str(tmp_path / "site")])
    assert seconds >= 0
    prefix = tmp_path / "out" / "caches" / "pycache"
    compiled = [p.name for p in prefix.rglob("*.pyc") if "site/pkg" in str(p)]  # (not the stdlib compileall ran on)
    assert len(compiled) == 1 and compiled[0].startswith("__init__.")
    assert not list((tmp_path / "site").rglob("*.pyc"))
    assert set(cold_start.installed_packages()) >= {__import__("sysconfig").get_paths()["purelib"]}
    record = {"label": "1_installed", "kind": "installed", "overrides": [], "bytecode_s": 12.5, "step1_s": 40.0,
              "wall_s": 42.0, "start_up": {"first_step": 40.0}, "vllm": {}, "exit_code": 0}
    assert "| 1_installed: installed (bytecode compiled before, 12.5 s) | 40.0 |" in cold_start.table([record])


def test_keep_models_empties_every_cache_but_the_models(tmp_path):
    """--keep-models: a fresh run starts with the converted model on disk (as a user's checkpoint is) and nothing
    else: no start plans, no compiled kernels, no bytecode."""
    env = cold_start.cache_env(tmp_path)
    mixrl = Path(env["MIXRL_CACHE"])
    for folder in ("gguf-smollm2", "vllm_start", "wheels"):
        (mixrl / folder).mkdir(parents=True)
    (mixrl / "gguf-smollm2" / "config.json").write_text("{}")
    (mixrl / "vllm_start" / "plan.json").write_text("{}")
    for var in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"):
        Path(env[var]).mkdir(parents=True)
        (Path(env[var]) / "kernel").write_text("x")
    cold_start.empty_caches(tmp_path, keep_models=True)
    assert sorted(p.relative_to(tmp_path / "caches").as_posix() for p in (tmp_path / "caches").rglob("*")) == \
        ["mixrl", "mixrl/gguf-smollm2", "mixrl/gguf-smollm2/config.json"]
    cold_start.empty_caches(tmp_path)
    assert not (tmp_path / "caches").exists()


@pytest.mark.slow
def test_a_fresh_run_on_the_embedded_default_reaches_step_one_and_fills_its_own_caches(tmp_path):
    r = cold_start.cold_start(tmp_path, "1_fresh", "fresh", "mixed_rl", [], timeout=900)
    assert r["exit_code"] == 0, (tmp_path / "1_fresh.log").read_text()[-3000:]
    assert 0 < r["step1_s"] <= r["wall_s"]
    assert list(r["start_up"])[-1] == "first_step" and {"model", "ray", "trainer"} <= set(r["start_up"])
    assert any((tmp_path / "caches" / "mixrl").iterdir())  # the embedded model was built there, not in ~/.cache
    assert any((tmp_path / "caches" / "pycache").rglob("*.pyc"))
    assert "1_fresh: fresh" in cold_start.table([r])


@pytest.mark.slow
def test_a_gguf_file_is_parsed_once_per_conversion(tmp_path, smollm2_path):
    """transformers parses the GGUF file for the tokenizer, the config and the weights, and rebuilds gguf's tensor
    name map per module: the conversion parses it once and builds the map once, and gives the same model."""
    import gguf

    from rl.models import SMOLLM2, convert_gguf, find_gguf

    counts = {"readers": 0, "name_maps": 0}
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map

    def counting_reader(*args, **kwargs):
        counts["readers"] += 1
        return reader_cls(*args, **kwargs)

    def counting_map(*args, **kwargs):
        counts["name_maps"] += 1
        return name_map(*args, **kwargs)

    gguf.GGUFReader, gguf.get_tensor_name_map = counting_reader, counting_map
    try:
        convert_gguf(find_gguf(SMOLLM2.split(":", 1)[1]), tmp_path / "out")
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_cls, name_map
    assert counts == {"readers": 1, "name_maps": 1}
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (tmp_path / "out" / name).read_bytes() == (Path(smollm2_path) / name).read_bytes()


def test_packages_without_cached_bytecode_are_named_when_none_will_be_written(tmp_path, monkeypatch):
    """A package with no bytecode is named when bytecode is not written (PYTHONDONTWRITEBYTECODE) or its folder is
    read-only, and not once its bytecode exists or can be written by the first import."""
    import importlib.util
    import py_compile

    from launch.startup import uncached_bytecode

    pkg = tmp_path / "slowpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "pycache_prefix", None)  # the package's own __pycache__, whatever the environment
    assert uncached_bytecode(["slowpkg", "no_such_package_here"], dont_write=True) == ["slowpkg"]
    assert uncached_bytecode(["slowpkg"], dont_write=False) == []  # the first import will write it
    pkg.chmod(0o555)
    try:
        if not os.access(pkg, os.W_OK):  # root writes anyway: then only the flag's case is checked
            assert uncached_bytecode(["slowpkg"], dont_write=False) == ["slowpkg"]
    finally:
        pkg.chmod(0o755)
    py_compile.compile(str(pkg / "__init__.py"), cfile=importlib.util.cache_from_source(str(pkg / "__init__.py")))
    assert uncached_bytecode(["slowpkg"], dont_write=True) == []
