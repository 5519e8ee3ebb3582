"""Fill vLLM's cache of what a model class supports before the run's vLLM instances ask for it.

Each vLLM instance, as it builds its config, asks vLLM's model registry about the model's class (multimodal, pooling,
attention-free, ...). Without a cached answer the registry starts a Python process of its own that imports vLLM and
the model's module, and writes the answer to VLLM_CACHE_ROOT/modelinfos, keyed by the module file's hash. On a
machine's first run every instance does that at once: ~10.5 s of each one's start on an H200 machine
(benchmarks/README.md, cold_start.py). Later runs read the file.

The driver starts `python -m rollout.vllm_model_info` when the run starts (`ModelInfoPrewarm`): the process imports
vLLM's registry while the driver finds or converts the model and starts Ray, then reads the model's folder on stdin
and answers for its `architectures` in its own process, as vLLM's helper process does (the driver never imports vLLM
or touches CUDA). It writes the same file vLLM would, so the instances read it instead of answering again. It is an
optimisation only: when it fails or is late, each instance answers for itself as before, and the run goes on.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Mapping

from rl.engine_specs import installed, placement_spec

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]


def architectures(model_dir: str | Path) -> list[str]:
    """The model's `architectures` (its config.json); empty when it has none or is not a local folder."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return []
    archs = config.get("architectures") if isinstance(config, dict) else None
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def prewarm_wanted(rcfg: Mapping) -> bool:
    """Whether this driver can prewarm for the rollout instances of `rcfg` (the `rollout` config): its engine plans
    as vLLM (`vllm`, or `auto`) and vLLM is installed here."""
    try:
        spec = placement_spec(rcfg)
    except (KeyError, ValueError):  # a misspelled engine: the config check that follows says so
        return False
    return spec.name == "vllm" and installed(spec)


class ModelInfoPrewarm:
    """The prewarm process, started now; `send(model_dir)` once the model's folder is known. `on_done(result)` is
    called from a thread once the process has written the answers (`wait`'s result)."""

    def __init__(self, on_done: Callable[[dict], None] | None = None):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        self.proc = subprocess.Popen([sys.executable, "-m", "rollout.vllm_model_info"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
        self.result: dict | None = None
        self._stopped = False
        self._on_done = on_done
        self._thread = threading.Thread(target=self._wait, name="vllm-model-info", daemon=True)
        self._thread.start()

    def send(self, model_dir: str | Path) -> None:
        """The model's folder: the process answers for its architectures and exits (nothing to do for a hub name)."""
        try:
            self.proc.stdin.write(f"{model_dir}\n".encode())
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError, OSError):  # it already ended (failed to import vLLM): nothing to warm
            pass

    def _wait(self) -> None:
        # not communicate(): it would close stdin before `send` has written the model's folder
        lines = self.proc.stdout.read().decode(errors="replace").strip().splitlines()
        self.proc.wait()
        try:
            self.result = json.loads(lines[-1]) if self.proc.returncode == 0 and lines else None
        except ValueError:
            self.result = None
        if self.result is None and not self._stopped:
            tail = lines[-3:]
            log.info("vLLM model-info prewarm did not finish (exit %s%s): each vLLM instance inspects the model "
                     "itself", self.proc.returncode, f": {' | '.join(tail)}" if tail else "")
        if self.result is not None and self._on_done is not None:
            self._on_done(self.result)

    def wait(self, timeout: float | None = None) -> dict | None:
        """The process's answer ({"architectures", "warmed", "import_seconds", "seconds"}), or None when it failed or
        is not done."""
        self._thread.join(timeout)
        return self.result

    def stop(self) -> None:
        """Ends the process if it still runs (a run that failed before its instances started)."""
        self._stopped = True
        if self.proc.poll() is None:
            self.send("")
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._thread.join(timeout=2)


def warm(archs: list[str], registry) -> list[str]:
    """Answer vLLM's registry (`registry`: the module vllm.model_executor.models.registry) for the model's
    architectures `archs` in this process, which its cache then keeps; returns the architectures answered."""
    # vLLM answers in a helper process only so that its own process does not initialise CUDA; this one is
    # that helper, so the question runs here and the registry's cache write that follows is vLLM's own
    registry._run_in_subprocess = lambda fn: fn()
    warmed = []
    for arch in archs:
        model = registry.ModelRegistry.models.get(arch)
        if model is not None:
            model.inspect_model_cls()
            warmed.append(arch)
    return warmed


def main() -> None:
    t0 = time.perf_counter()
    from vllm.model_executor.models import registry
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # as vLLM's helper process does: plugins may register architectures
    imported = time.perf_counter() - t0
    model_dir = sys.stdin.readline().strip()
    if not model_dir:
        return
    archs = architectures(model_dir)
    warmed = warm(archs, registry)
    print(json.dumps({"architectures": archs, "warmed": warmed, "import_seconds": round(imported, 2),
                      "seconds": round(time.perf_counter() - t0, 2)}), flush=True)


if __name__ == "__main__":
    main()
