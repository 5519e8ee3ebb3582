"""`python -m launch.pipeline +experiment=v32_pipeline [overrides]`: DeepSeek-V3.2's post-training in one command.

Stages, each in its own folder under run_dir and each a subprocess of an existing entry point (its own Ray cluster
and memory, so one stage's actors and caches never outlive it, and a stage killed part-way leaves the run_dir that
`trainer.resume=auto` continues):

    specialists/<d>/  python -m launch.train     RL on domain d alone (the experiment with its other domains removed)
    generated/        python -m launch.generate  each specialist samples its domain's prompts; the kept rows go to
                                                 generated/data.jsonl
    sft/              python -m launch.sft       the base model (the specialists' model.path) trained on
                                                 generated/data.jsonl
    mixed_rl/         python -m launch.train     RL on every domain of the experiment, from sft's last checkpoint

A stage is done when its folder holds STAGE_COMPLETE, written here once the stage exited 0 and left what the next
stage reads (a complete checkpoint; generation's own COMPLETE, which also counts by itself). Done stages are
skipped, so the same command with the same run_dir goes on where an earlier one stopped; an unfinished stage runs
again with trainer.resume=auto (launch.generate resumes by itself). To redo a stage, delete its STAGE_COMPLETE
(and those of the stages after it, which are not redone otherwise).

The command line's overrides other than `pipeline.*`, `+experiment=`, `run_dir=` and `run_name=` go to every stage
(model.path=..., rollout=vllm, trainer.device=cuda, ...), before the stage's own (`pipeline.<stage>_overrides`);
`domains.*` and `algorithm.*` ones skip SFT, which trains on a dataset with its own algorithm group. The training stages log to one W&B group,
the pipeline's run_name (kept in run_dir/pipeline.json, so a rerun without run_name= joins it), as
<run_name>-<stage> (generation logs no W&B run: its counts are in generated/COMPLETE). A stage's console output is
shown as it comes and kept in run_dir/logs/<stage>.log; a failed stage stops the pipeline with its exit code.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from launch.checkpoint import RunError, complete_checkpoints
from launch.config import check_config, compose
from launch.run_dir import RunDirLock
from launch.sft import with_sft
from rl.config import ConfigError

STAGE_COMPLETE = "STAGE_COMPLETE"  # written by the pipeline when a stage ended well
GENERATE_COMPLETE = "COMPLETE"     # written by launch.generate when its data.jsonl is whole
STATE = "pipeline.json"            # the pipeline's run_name, fixed by its first run
STOP_AFTER = ("specialists", "generate", "sft")
KEYS = {"experiment": str, "specialists": list, "specialist_overrides": list, "generate_overrides": list,
        "sft_experiment": str, "sft_overrides": list, "rl_overrides": list, "stop_after": (str, type(None))}
OWN_KEYS = ("experiment", "run_dir", "run_name")  # with pipeline.*: the pipeline's, not forwarded to stages
TRAIN_MODULES = ("launch.train", "launch.sft")
# A training stage resumes where it stopped and leaves its last step's checkpoint to the next stage (a forwarded
# trainer.save_last=false would hand that stage an older model, or none)
RESUMABLE = ("trainer.resume=auto", "trainer.save_last=true")


@dataclass
class Stage:
    """One stage: `python -m <module> <overrides> <inputs>`, writing to `dir`."""

    name: str             # specialists/<d> | generated | sft | mixed_rl (its folder under run_dir)
    module: str           # the entry point it runs
    dir: Path
    overrides: list[str]  # Hydra overrides, in order (a later one wins)
    # override key -> the earlier stage's folder whose newest complete checkpoint's hf/ is the value; resolved when
    # the stage starts (the earlier stage has run by then)
    inputs: dict[str, Path] = field(default_factory=dict)

    def args(self, resolve=None) -> list[str]:
        """The overrides with the inputs filled in (`resolve(stage_dir) -> path`, the newest checkpoint's hf/)."""
        resolve = resolve or newest_hf
        return [*self.overrides, *(f"{key}={resolve(src)}" for key, src in self.inputs.items())]

    def complete(self) -> bool:
        """Done earlier: skipped from now on (delete STAGE_COMPLETE to run it again)."""
        return (self.dir / STAGE_COMPLETE).exists() or (
            self.module == "launch.generate" and (self.dir / GENERATE_COMPLETE).exists())


def override_key(arg: str) -> str:
    """`+a.b=1`, `~a.b`, `++a.b=1` -> `a.b`."""
    return arg.split("=", 1)[0].lstrip("+~")


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the pipeline's own overrides: pipeline.*, +experiment=, run_dir=, run_name=; those forwarded to stages)."""
    own, forwarded = [], []
    for arg in argv:
        key = override_key(arg)
        (own if key in OWN_KEYS or key.split(".")[0] == "pipeline" else forwarded).append(arg)
    return own, forwarded


def newest_hf(stage_dir: Path) -> str:
    """The HF folder of the stage's newest complete checkpoint: what the next stage starts from."""
    done = complete_checkpoints(stage_dir)
    if not done:
        raise RunError(f"{stage_dir}: no complete checkpoint (checkpoints/step_N/COMPLETE) to take the model from")
    return str(done[-1] / "hf")


def check_pipeline_block(p, domains: list[str] | None = None) -> dict:
    """The `pipeline:` block, every key checked (one line per mistake); the specialists against `domains` (those
    of pipeline.experiment) when given."""
    if not isinstance(p, dict):
        raise ConfigError("no pipeline block in the config: pass +experiment=v32_pipeline (conf/experiment/"
                          "v32_pipeline.yaml) or an experiment of your own with a pipeline: block")
    unknown = sorted(set(p) - set(KEYS))
    if unknown:
        raise ConfigError(f"pipeline.{unknown[0]}: unknown key; known: {sorted(KEYS)}")
    for key, kind in KEYS.items():
        if key not in p:
            raise ConfigError(f"pipeline.{key}: missing")
        if not isinstance(p[key], kind):
            raise ConfigError(f"pipeline.{key}={p[key]!r}: must be a {getattr(kind, '__name__', 'string or null')}")
        if kind is list and not all(isinstance(x, str) for x in p[key]):
            raise ConfigError(f"pipeline.{key}: a list of Hydra overrides (strings), got {p[key]!r}")
    if p["stop_after"] is not None and p["stop_after"] not in STOP_AFTER:
        raise ConfigError(f"pipeline.stop_after={p['stop_after']}: one of {', '.join(STOP_AFTER)} or null (run all)")
    if not p["specialists"]:
        raise ConfigError("pipeline.specialists: name at least one domain (the specialists generate the SFT data)")
    for d in p["specialists"] if domains is not None else []:
        if d not in domains:
            raise ConfigError(f"pipeline.specialists: {d!r} is not a domain of +experiment={p['experiment']} "
                              f"(its domains: {', '.join(domains) or 'none'})")
    if len(set(p["specialists"])) != len(p["specialists"]):
        raise ConfigError(f"pipeline.specialists={p['specialists']}: a domain is named twice")
    return p


def plan(p: dict, exp_cfg: dict, forwarded: list[str], run_dir: Path, run_name: str) -> list[Stage]:
    """Every stage up to `pipeline.stop_after`, as command lines. `exp_cfg`: pipeline.experiment composed with the
    forwarded overrides (its domains; its logger.group, which, when set, replaces the pipeline's own group)."""
    domains, exp = list(exp_cfg["domains"]), f"+experiment={p['experiment']}"
    group = [] if exp_cfg["logger"].get("group") else [f"logger.group={run_name}"]

    def tail(stage_dir: Path, name: str) -> list[str]:
        return [f"run_dir={stage_dir}", f"run_name={run_name}-{name}", *group]

    stages = []
    for d in p["specialists"]:
        sd = run_dir / "specialists" / d
        others = [f"~domains.{o}" for o in domains if o != d]  # after the user's, which may still name them
        stages.append(Stage(f"specialists/{d}", "launch.train", sd, [
            exp, *forwarded, *p["specialist_overrides"], *others, *RESUMABLE, *tail(sd, f"specialist-{d}")]))
    if p["stop_after"] == "specialists":
        return stages
    gd = run_dir / "generated"
    others = [f"~domains.{o}" for o in domains if o not in p["specialists"]]
    # one path per domain: the specialist generates in every thinking mode its domain has
    generators = {f"++generate.generators.{d}": run_dir / "specialists" / d for d in p["specialists"]}
    stages.append(Stage("generated", "launch.generate", gd, [
        exp, *forwarded, *p["generate_overrides"], *others, f"generate.out={gd}", *tail(gd, "generate")], generators))
    if p["stop_after"] == "generate":
        return stages
    sd = run_dir / "sft"
    # RL's keys stay with the RL stages: SFT has no domains, and its algorithm group is sft's (algorithm.clip_eps_high
    # or algorithm.objective there would be unknown keys or another objective)
    no_domains = [a for a in forwarded if override_key(a).split(".")[0] not in ("domains", "algorithm")]
    # the base: the model the specialists started from (pipeline.experiment's, or the command line's)
    base = f"model.path={exp_cfg['model']['path']}"
    stages.append(Stage("sft", "launch.sft", sd, [
        f"+experiment={p['sft_experiment']}", *no_domains, base, *p["sft_overrides"],
        f"algorithm.dataset.path={gd / 'data.jsonl'}", *RESUMABLE, *tail(sd, "sft")]))
    if p["stop_after"] == "sft":
        return stages
    md = run_dir / "mixed_rl"
    stages.append(Stage("mixed_rl", "launch.train", md, [
        exp, *forwarded, *p["rl_overrides"], *RESUMABLE, *tail(md, "mixed_rl")], {"model.path": sd}))
    return stages


def check_stage(stage: Stage) -> None:
    """The stage's overrides compose, and a training stage's config passes the checks its run makes at start (so a
    typo in rl_overrides stops the pipeline now, not after the specialists). Inputs not made yet are stand-ins."""
    args = stage.args(lambda src: str(src / "checkpoints" / "step_000000" / "hf"))
    try:
        cfg = compose(with_sft(args) if stage.module == "launch.sft" else args)
        if stage.module in TRAIN_MODULES:
            check_config(copy.deepcopy(cfg))
        elif stage.module == "launch.generate":  # its own block (k, keep, ...); the generators do not exist yet
            from launch.generate import check_generate

            check_generate(copy.deepcopy(cfg))
    except ConfigError as e:
        raise ConfigError(f"stage {stage.name}: {e}") from None


class Pipeline:
    def __init__(self, argv: list[str]):
        """Compose and check everything (ConfigError on the first mistake); nothing is written yet."""
        for arg in argv:
            if arg.startswith("-"):
                raise ConfigError(f"{arg}: launch.pipeline takes Hydra overrides only (see python -m launch.pipeline "
                                  "--help)")
        own, self.forwarded = split_argv(argv)
        cfg = compose(own)
        p = check_pipeline_block(cfg.get("pipeline"))
        try:
            exp_cfg = compose([f"+experiment={p['experiment']}", *self.forwarded])
        except ConfigError as e:
            raise ConfigError(f"pipeline.experiment={p['experiment']} with the command line's overrides: {e}") from None
        self.p = check_pipeline_block(p, list(exp_cfg.get("domains") or {}))
        self.run_dir = Path(cfg["run_dir"]).resolve()
        state = self.run_dir / STATE
        self.run_name = str(cfg["run_name"])
        if state.exists() and not any(override_key(a) == "run_name" for a in own):
            self.run_name = json.loads(state.read_text())["run_name"]  # a rerun joins the first run's W&B group
        self.stages = plan(self.p, exp_cfg, self.forwarded, self.run_dir, self.run_name)
        for stage in self.stages:
            if not stage.complete():
                check_stage(stage)

    def run(self) -> int:
        """Each stage in turn (skipped when complete); the stage's exit code when one fails, else 0."""
        lock = RunDirLock(self.run_dir)  # one pipeline per run_dir (each stage also locks its own folder)
        try:
            (self.run_dir / STATE).write_text(json.dumps({"run_name": self.run_name}) + "\n")
            say(f"run_dir={self.run_dir} (the same command with run_dir={self.run_dir} continues this pipeline), "
                f"stages: {', '.join(s.name for s in self.stages)}")
            results, began = [], time.time()
            for i, stage in enumerate(self.stages, 1):
                if stage.complete():
                    say(f"stage {i}/{len(self.stages)} {stage.name}: complete, skipped ({stage.dir})")
                    results.append(result(stage, "skipped", 0.0))
                    continue
                code, seconds = self.run_stage(stage, i)
                if code != 0:
                    results.append(result(stage, f"failed (exit {code})", seconds))
                    write_summary(self.run_dir, results, time.time() - began)
                    say(f"stage {stage.name} failed (exit {code}); its log: {self.stage_log(stage)}; rerun the "
                        f"same command with run_dir={self.run_dir} to continue from there")
                    return code
                results.append(result(stage, "ran", seconds))
            print(write_summary(self.run_dir, results, time.time() - began), flush=True)
            return 0
        finally:
            lock.release()

    def console_log(self, stage: Stage) -> Path:
        return self.run_dir / "logs" / f"{stage.name.replace('/', '-')}.log"

    def stage_log(self, stage: Stage) -> str:
        """Where to look when a stage failed: its run's log (the workers write there: why an actor died), and its
        console output (all a refused start or a generation leaves)."""
        own = stage.dir / "train.log"
        console = self.console_log(stage)
        return f"{own} (its console output: {console})" if own.exists() else str(console)

    def run_stage(self, stage: Stage, i: int) -> tuple[int, float]:
        """Run the stage's entry point, its output (progress bars included) shown as it comes and appended to
        run_dir/logs/<stage>.log; on success, check its output and mark the stage complete. Returns (exit code,
        seconds)."""
        args = stage.args()
        command = f"python -m {stage.module} {' '.join(args)}"
        say(f"stage {i}/{len(self.stages)} {stage.name}: {command}")
        log_path = self.console_log(stage)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        start = time.time()
        with log_path.open("ab") as log_file:
            log_file.write(f"[pipeline] {time.strftime('%Y-%m-%d %H:%M:%S')} {command}\n".encode())
            proc = subprocess.Popen([sys.executable, "-m", stage.module, *args], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT)
            # a thread copies the output, so it is drained also while a Ctrl-C below waits for the stage to stop
            copier = threading.Thread(target=tee, args=(proc.stdout, log_file), daemon=True)
            copier.start()
            try:
                code = proc.wait()
            except KeyboardInterrupt:  # Ctrl-C: the terminal sent it to the stage too, which is stopping
                stop(proc, grace=30)
                raise
            except SystemExit:  # SIGTERM to the pipeline alone (main's handler): pass it on
                stop(proc, grace=0)
                raise
            finally:
                copier.join(timeout=10)
        seconds = time.time() - start
        code = 128 - code if code < 0 else code  # killed by a signal: the shell's convention
        if code == 0:
            missing = output_problem(stage)
            if missing:
                say(f"stage {stage.name} exited 0 but {missing}")
                return 1, seconds
            (stage.dir / STAGE_COMPLETE).write_text(json.dumps(
                {"seconds": round(seconds, 1), "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "command": ["python", "-m", stage.module, *args]}, indent=1) + "\n")
        return code, seconds


def stop(proc: subprocess.Popen, grace: float) -> None:
    """End a stage the pipeline is leaving: after `grace` seconds a SIGINT (the stage stops its actors and frees its
    run_dir, as on Ctrl-C), after 60 more a kill."""
    for sig, wait in ((None, grace), (signal.SIGINT, 60), (signal.SIGKILL, None)):
        if proc.poll() is not None:
            return
        if sig is not None:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def output_problem(stage: Stage) -> str | None:
    """What the next stage needs and the stage did not leave, or None."""
    if stage.module == "launch.generate":
        if not (stage.dir / GENERATE_COMPLETE).exists() or not (stage.dir / "data.jsonl").exists():
            return f"{stage.dir} has no COMPLETE and data.jsonl"
        return None
    if not complete_checkpoints(stage.dir):
        return f"{stage.dir / 'checkpoints'} holds no complete checkpoint"
    return None


def tee(src, log_file) -> None:
    """The stage's output, byte for byte (a progress bar's carriage returns included), to the console and its log."""
    console = getattr(sys.stdout, "buffer", None)
    for chunk in iter(lambda: os.read(src.fileno(), 1 << 16), b""):
        if console is not None:
            console.write(chunk)
            console.flush()
        else:
            print(chunk.decode(errors="replace"), end="", flush=True)
        log_file.write(chunk)
        log_file.flush()


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line torn by a kill mid-write
                continue
    return rows


def last(rows: list[dict], key: str):
    return next((r[key] for r in reversed(rows) if r.get(key) is not None), None)


def stage_metrics(stage: Stage) -> dict:
    """A stage's numbers of interest: RL, per domain the last held-out pass@k (else the last mean reward); SFT,
    its first and last loss; generation, the kept rows per domain and mode."""
    if stage.module == "launch.generate":
        rows = read_jsonl(stage.dir / "data.jsonl")
        return {"rows": len(rows), **{f"rows/{d}/{m}": n for (d, m), n in sorted(
            Counter((str(r.get("domain")), str(r.get("mode"))) for r in rows).items())}}
    rows = read_jsonl(stage.dir / "metrics.jsonl")
    out = {"steps": last(rows, "step")}
    if stage.module == "launch.sft":
        out["loss/sft first"] = next((r["loss/sft"] for r in rows if r.get("loss/sft") is not None), None)
        out["loss/sft last"] = last(rows, "loss/sft")
        return out
    domains = sorted({k.split("/")[1] for r in rows for k in r if k.startswith("reward/") and k.count("/") == 2})
    for d in domains:
        key = f"eval/{d}/pass@k" if last(rows, f"eval/{d}/pass@k") is not None else f"reward/{d}/mean"
        out[key] = last(rows, key)
    return out


def result(stage: Stage, status: str, seconds: float) -> dict:
    row = {"stage": stage.name, "status": status, "seconds": round(seconds, 1), "dir": str(stage.dir),
           "metrics": stage_metrics(stage)}
    if status == "skipped":  # how long it took when it ran
        try:
            row["ran_seconds"] = json.loads((stage.dir / STAGE_COMPLETE).read_text()).get("seconds")
        except (OSError, ValueError):
            pass
    return row


def write_summary(run_dir: Path, results: list[dict], seconds: float) -> str:
    """run_dir/summary.json, and the same as text for the console."""
    (run_dir / "summary.json").write_text(json.dumps({"seconds": round(seconds, 1), "stages": results}, indent=1))
    lines = [f"pipeline done in {seconds:.0f} s ({run_dir}):"]
    for r in results:
        took = f"{r['seconds']:.0f} s" if r["status"] != "skipped" else (
            f"ran earlier in {r['ran_seconds']:.0f} s" if r.get("ran_seconds") is not None else "ran earlier")
        nums = ", ".join(f"{k} {fmt(v)}" for k, v in r["metrics"].items() if v is not None)
        lines.append(f"  {r['stage']:<20} {r['status']:<8} {took:<22} {nums}")
    final = Path(results[-1]["dir"]) if results else None
    if final is not None and complete_checkpoints(final):
        lines.append(f"  last model: {newest_hf(final)}")
    return "\n".join(lines)


def fmt(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def say(msg: str) -> None:
    print(f"[pipeline] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """The CLI: 0 when every stage is done, 2 for a config mistake, else the failed stage's exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    try:
        pipeline = Pipeline(argv)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    # a kill of the pipeline alone (SIGTERM) reaches the running stage too (Pipeline.run_stage)
    signal.signal(signal.SIGTERM, lambda sig, _frame: sys.exit(128 + sig))
    try:
        return pipeline.run()
    except KeyboardInterrupt:
        say(f"interrupted; the same command with run_dir={pipeline.run_dir} continues the pipeline")
        return 130
    except ConfigError as e:  # the run_dir is in use by another pipeline
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except RunError as e:
        print(f"[pipeline] {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
