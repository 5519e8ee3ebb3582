"""The package layers (README, Architecture): rl < rewards, trainer < rollout < launch. Every import, lazy ones
inside functions included, points down, never sideways; and no package has an import cycle inside it."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYER = {"rl": 0, "rewards": 1, "trainer": 1, "rollout": 2, "launch": 3}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module this file imports (absolute names; relative imports resolved)."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # `from pkg import module`
    return out


def project_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for pkg in LAYER for p in (ROOT / pkg).rglob("*.py")}
    # A module's own package (`from . import x` names it) is imported implicitly anyway: not an edge.
    own = lambda m, i: i == m or m.startswith(i + ".")  # noqa: E731
    return {m: {i for i in imports_of(p) if i in modules and not own(m, i)} for m, p in modules.items()}


def test_imports_point_down():
    bad = []
    for mod, deps in project_graph().items():
        here = mod.split(".")[0]
        for dep in deps:
            there = dep.split(".")[0]
            if there != here and LAYER[there] >= LAYER[here]:
                bad.append(f"{mod} -> {dep}")
    assert not bad, "imports that do not point down a layer:\n" + "\n".join(sorted(bad))


def test_no_import_cycle_inside_a_package():
    graph = project_graph()
    cycles, state = [], {}

    def visit(mod, stack):
        state[mod] = "open"
        for dep in sorted(graph[mod]):
            if dep.split(".")[0] != mod.split(".")[0]:
                continue
            if state.get(dep) == "open":
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[mod] = "done"

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [mod])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_lazy_and_relative_imports():
    graph = project_graph()
    assert "rollout.agent" in graph["rollout.worker"]  # a lazy import inside RolloutWorker.__init__
    assert "rewards.compose" in graph["rewards.worker"]  # a relative import
