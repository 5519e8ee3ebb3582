"""`python -m launch.check_env [ENV ...]`: check agent environments (bundled names or directories; none: every
bundled one). For each, one line: tasks, reference solutions passing their verifier through the tools alone,
perturbed solutions failing; then one indented line per failure. Exits 1 when any reference solution fails, any
perturbed one passes, the verifier raises, or an environment does not load (see rollout.envs.base.check_env).
"""

from __future__ import annotations

import argparse
import sys

from rollout.envs.base import bundled_envs, check_env, load_env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.check_env", description=__doc__.split("\n\n")[0])
    parser.add_argument("envs", nargs="*", help="bundled environment names or environment directories")
    parser.add_argument("--max-tasks", type=int, default=None, help="check only the first N tasks of each")
    parser.add_argument("--workers", type=int, default=2, help="tasks checked at once (default 2)")
    args = parser.parse_args(argv)
    ok = True
    for name in args.envs or bundled_envs():
        try:
            env = load_env(name)
            tasks = env.tasks()[: args.max_tasks] if args.max_tasks else None
            report = check_env(env, tasks, workers=args.workers)
        except Exception as exc:  # noqa: BLE001 - one broken environment must not hide the others' results
            print(f"{name}: FAILED to load or check: {type(exc).__name__}: {exc}")
            ok = False
            continue
        ok &= report["ok"]
        print(f"{report['env']}: {'ok' if report['ok'] else 'FAILED'}: {report['tasks']} tasks, reference "
              f"solutions {report['reference_passed']}/{report['with_reference']} pass, perturbed "
              f"{report['perturbed_failed']}/{report['perturbed']} fail ({report['seconds']:.1f} s)")
        for line in report["failures"]:
            print(f"  {line}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
