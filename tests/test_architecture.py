"""The package's imports run one way: the layers of docs/architecture.md, from the command line down."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pipeline_sim"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str) -> list[tuple[str, bool]]:
    """The package modules that module ``name`` imports, each with whether the import sits inside a function."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(id(child) for child in ast.walk(node) if child is not node)
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            source = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
                       for alias in node.names]
        for target in targets:
            if target in MODULES and target != name:
                found.append((target, id(node) in inside))
    return found


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_at_module_level():
    edges = {name: {target for target, in_function in imports(name) if not in_function} for name in MODULES}
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges) or [])


def test_no_import_inside_a_function_closes_a_cycle():
    """An import placed inside a function is there to load something heavy late, never to dodge a circle."""
    edges = {name: {target for target, _ in imports(name)} for name in MODULES}
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges) or [])


def layers() -> dict[str, int]:
    """Module -> floor number, from the table of docs/architecture.md (floor 0 at the bottom)."""
    floors = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        row = re.fullmatch(r"\|\s*(\d+)\s*\|([^|]+)\|.*\|", line)
        if row:
            for module in re.findall(r"`([\w.]+)`", row.group(2)):
                floors[f"pipeline_sim.{module}" if module != "pipeline_sim" else module] = int(row.group(1))
    return floors


def floor_of(module: str, floors: dict[str, int]) -> int:
    while module not in floors and "." in module:
        module = module.rpartition(".")[0]
    return floors[module]


def test_every_module_has_a_floor_in_the_architecture():
    floors = layers()
    assert floors, "docs/architecture.md has no table of layers"
    missing = [name for name in MODULES if not any(name == f or name.startswith(f + ".") for f in floors)]
    assert not missing, f"modules on no floor of docs/architecture.md: {missing}"
    stale = [f for f in floors if f not in MODULES]
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"


def test_the_kernel_rooms_name_every_file_of_the_kernel():
    text = (ROOT / "docs" / "architecture.md").read_text().split("## The kernel's rooms")[1]
    named = set(re.findall(r"^- `(\w+\.py)`", text, flags=re.MULTILINE))
    files = {path.name for path in (PACKAGE / "kernel").glob("*.py") if path.name != "__init__.py"}
    assert named == files


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_run_down_the_floors(name):
    floors = layers()
    here = floor_of(name, floors)
    upward = [f"{target} (floor {floor_of(target, floors)})" for target, _ in imports(name)
              if floor_of(target, floors) > here and not target.startswith(name + ".")]
    assert not upward, f"{name} (floor {here}) imports from above: {upward}"
