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
