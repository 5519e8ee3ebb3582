"""Import a script that is not a package module (benchmarks/*.py, an environment's generate.py) for its tests."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: Path, name: str | None = None, register: bool = False):
    """The module of the script at `path` (relative paths from the project root), as `name` (default its stem).
    `register`: also put it in sys.modules, where dataclasses and pickle look a module's classes up."""
    path = ROOT / path
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    if register:
        sys.modules.setdefault(spec.name, mod)
    spec.loader.exec_module(mod)
    return mod
