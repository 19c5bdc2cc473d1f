"""The shape of the package: the import direction between its stages, no import cycle between its modules, Typer
kept to the CLI, a light `--help`, and tests that share code only through tests.support."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "attnscope"
TESTS = ROOT / "tests"
# A module of a stage imports only modules of its own stage or of lower ones. Rendering (output) sits below the
# analyses: a result hands itself to its view (`result.to_json()`, `_repr_html_`), and views read results by duck
# typing, never importing a result class (see analyses/result.py). Interop adapts the files of --out to other tools
# (kvpress), reading them with output's names of them.
STAGES = ["base", "scores", "models", "settings", "pipeline", "output", "interop", "analyses", "registry", "api", "cli"]


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _stage(module: str) -> str:
    """attnscope.errors, attnscope.options (every option's domain), attnscope.threads (the worker threads) and
    attnscope itself: base; attnscope.<stage>.x: <stage> (attnscope.settings: every command's settings, declared
    once, light enough for `--help`); attnscope.api: api (the Python API, above the output it hands back);
    attnscope.cli, __main__: cli."""
    parts = module.split(".")
    if parts[0] != "attnscope":
        raise ValueError(module)
    if len(parts) == 1 or parts[1] in ("errors", "domains", "options", "threads"):
        return "base"
    if parts[1] in ("cli", "__main__"):
        return "cli"
    return parts[1]


@functools.cache
def _parsed(path: Path, text: str) -> ast.Module:
    return ast.parse(text, filename=str(path))


def _tree(path: Path) -> ast.Module:
    """The module's syntax tree (parsed once per content: the checks below walk every module several times)."""
    return _parsed(path, path.read_text(encoding="utf-8"))


@functools.cache
def _imports(path: Path, module: str, top_level_only: bool = False) -> list[tuple[str, int]]:
    """Every module an `import` or `from ... import` names, at any depth (inside functions too; only outside them
    with `top_level_only`), relative imports resolved: (module, line)."""
    tree = _tree(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    inside = {
        id(node)
        for function in ast.walk(tree)
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(function)
    }
    found = []
    for node in ast.walk(tree):
        if top_level_only and id(node) in inside:
            continue
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.append((target, node.lineno))
            # `from attnscope import analyses` names the module attnscope.analyses
            found.extend((f"{target}.{alias.name}", node.lineno) for alias in node.names)
    return found


def _package_modules(root: Path = ROOT) -> list[tuple[Path, str]]:
    return [(path, _module_name(path, root)) for path in sorted((root / "attnscope").rglob("*.py"))]


def _upward_imports(root: Path = ROOT) -> list[str]:
    """Every import of a module of a higher stage, as `path:line (stage) imports module`."""
    modules = _package_modules(root)
    known = {module for _, module in modules}
    wrong = []
    for path, module in modules:
        own = STAGES.index(_stage(module))
        for target, line in _imports(path, module):
            if target.split(".")[0] != "attnscope" or target not in known:  # `from m import name`: not a module
                continue
            if STAGES.index(_stage(target)) > own:
                wrong.append(f"{path.relative_to(root)}:{line} ({_stage(module)}) imports {target}")
    return wrong


def _import_cycles(root: Path = ROOT) -> list[list[str]]:
    """The package's import cycles: every strongly connected set of two or more modules of the graph `module ->
    each module it imports` (imports at any depth: inside functions and `if TYPE_CHECKING:` too), each sorted;
    Tarjan's algorithm, iterative."""
    modules = _package_modules(root)
    known = {module for _, module in modules}
    graph = {
        module: sorted({target for target, _ in _imports(path, module) if target in known and target != module})
        for path, module in modules
    }
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in graph:
        if start in order:
            continue
        work = [(start, iter(graph[start]))]
        order[start] = low[start] = len(order)
        stack.append(start)
        on_stack.add(start)
        while work:
            module, edges = work[-1]
            target = next(edges, None)
            if target is not None:
                if target not in order:
                    order[target] = low[target] = len(order)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph[target])))
                elif target in on_stack:
                    low[module] = min(low[module], order[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == order[module]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == module:
                        break
                if len(members) > 1:
                    cycles.append(sorted(members))
    return sorted(cycles)


# Radon's cyclomatic complexity of a function (1, and 1 more for each branch it can take) at most 20, the top of
# radon's rank C: past it, a function is a list of cases that reads better as named steps
MOST_COMPLEX = 20


def _complexities(root: Path = ROOT) -> dict[str, int]:
    """Every function's, method's and nested function's cyclomatic complexity (radon's: a nested function's
    branches are its own, not its holder's), as `path:Class.function.nested` -> complexity."""
    from radon.visitors import Class, ComplexityVisitor

    found = {}

    def visit(blocks: list, within: str) -> None:
        for block in blocks:
            name = f"{within}{block.name}"
            if isinstance(block, Class):
                visit(block.methods + block.inner_classes, f"{name}.")
            else:
                found[name] = block.complexity
                visit(block.closures, f"{name}.")

    for path, _ in _package_modules(root):
        module = ComplexityVisitor.from_code(path.read_text(encoding="utf-8"))
        visit(module.functions + module.classes, f"{path.relative_to(root)}:")
    return found


def test_every_module_belongs_to_a_stage():
    modules = _package_modules()
    assert len(modules) > 30
    for _, module in modules:
        assert _stage(module) in STAGES, module


def test_imports_point_down_the_stages():
    """errors/__init__ < scores < models < settings < pipeline < output < interop < analyses < api < cli: a lower
    stage never imports a higher one, not even inside a function."""
    assert _upward_imports() == []


def test_the_cli_goes_through_the_api_alone():
    """One front door: the command line imports the API, the renderers (output), the option domains and the error
    type, never the analyses, the pipeline, the models or the settings' modules behind the API; every command is an
    API function with options made from its declarations (tests/unit/test_api.py)."""
    allowed = ("attnscope.api", "attnscope.output", "attnscope.options", "attnscope.errors", "attnscope.cli")
    modules = _package_modules()
    known = {module for _, module in modules} - {"attnscope"}
    wrong = []
    for path, module in modules:
        if _stage(module) != "cli":
            continue
        for target, line in _imports(path, module):
            if target in known and not target.startswith(allowed):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert wrong == []


def test_no_module_imports_itself_back():
    """No import cycle anywhere in the package, whatever the stages: each folder's files import one way."""
    assert _import_cycles() == []


def test_the_cycle_check_finds_a_cycle_at_any_depth(tmp_path):
    """The check above must not pass for want of looking: a cycle through an import inside a function, three
    modules long, inside one stage, and a module importing itself (no cycle) beside an acyclic chain."""
    files = {
        "__init__": "",
        "output/__init__": "",
        "output/a": "from attnscope.output import b\n",
        "output/b": "def draw():\n    if True:\n        from . import c\n",
        "output/c": "from ..output.a import name\n",
        "output/d": "from attnscope.output import d, a\n",
    }
    for name, text in files.items():
        (tmp_path / "attnscope" / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "attnscope" / f"{name}.py").write_text(text)
    assert _import_cycles(tmp_path) == [["attnscope.output.a", "attnscope.output.b", "attnscope.output.c"]]


def test_the_import_check_finds_an_upward_import_at_any_depth(tmp_path):
    """The check above must not pass for want of looking."""
    for name in ("__init__", "errors", "scores/__init__", "scores/fake", "output/__init__", "output/views"):
        (tmp_path / "attnscope" / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "attnscope" / f"{name}.py").write_text("")
    fake = tmp_path / "attnscope" / "scores" / "fake.py"
    fake.write_text(
        "from attnscope import errors\n"
        "from . import fake\n"
        "def f():\n"
        "    if True:\n"
        "        from attnscope.output import views\n"
        "    from ..output import views as again\n"
        "    import attnscope.output.views\n"
    )
    assert sorted(_upward_imports(tmp_path)) == [
        "attnscope/scores/fake.py:5 (scores) imports attnscope.output",
        "attnscope/scores/fake.py:5 (scores) imports attnscope.output.views",
        "attnscope/scores/fake.py:6 (scores) imports attnscope.output",
        "attnscope/scores/fake.py:6 (scores) imports attnscope.output.views",
        "attnscope/scores/fake.py:7 (scores) imports attnscope.output.views",
    ]


def test_no_function_is_past_radon_rank_c():
    """Every function and method of the package takes at most MOST_COMPLEX branches (radon's cyclomatic complexity;
    `radon cc -s -n D attnscope` lists those past it): a longer flow is a sequence of named steps."""
    found = _complexities()
    assert len(found) > 500
    assert {name: value for name, value in found.items() if value > MOST_COMPLEX} == {}


def test_the_complexity_check_finds_a_complex_function_and_method(tmp_path):
    """The check above must not pass for want of looking: a function, a method and a nested function of 21
    branches each."""
    branches = "".join(f"if x == {k}:\n    return {k}\n" for k in range(20))

    def body(indent: int) -> str:
        return "".join(" " * indent + line + "\n" for line in branches.splitlines())

    source = (
        f"def flat(x):\n{body(4)}\n"
        f"class A:\n    def run(self, x):\n{body(8)}\n"
        f"def outer(x):\n    def inner(x):\n{body(8)}    return inner(x)\n"
    )
    (tmp_path / "attnscope").mkdir()
    (tmp_path / "attnscope" / "wide.py").write_text(source)
    assert _complexities(tmp_path) == {
        "attnscope/wide.py:flat": 21,
        "attnscope/wide.py:A.run": 21,
        "attnscope/wide.py:outer": 1,
        "attnscope/wide.py:outer.inner": 21,
    }


def test_every_command_has_one_room_and_every_result_its_view():
    """Each command's rendering lives in one module, output/<command>.py, and each command's result (its record in
    attnscope.registry) names a View of that room; every result class of the analyses is some command's."""
    import importlib

    from attnscope import registry
    from attnscope.output.views import View

    results = sorted(
        node.name
        for path, _ in _package_modules()
        if path.parent.name == "analyses"
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.ClassDef) and any(getattr(base, "id", None) == "Result" for base in node.bases)
    )
    assert results == sorted(command.result.rpartition(".")[2] for command in registry.COMMANDS)
    for command in registry.COMMANDS:
        module, _, name = command.result.rpartition(".")
        view = getattr(importlib.import_module(module), name).view_class
        assert issubclass(view, View) and view.__module__ == f"attnscope.output.{command.function}", command.name
        assert view.command == command.name


def test_the_lazy_names_of_the_package_load_their_modules():
    """`attnscope/__init__` names a few things of higher stages by string, loaded when first used (not an import
    statement, so the package imports without torch)."""
    import attnscope
    from attnscope import api, registry
    from attnscope.pipeline.inputs import Text

    assert attnscope.Text is Text
    names = ("load", *(function.__name__ for function in api.COMMANDS.values()))
    assert len(names) == 1 + len(api.COMMANDS) and list(api.COMMANDS) == [c.name for c in registry.COMMANDS]
    for name in names:
        assert getattr(attnscope, name) is getattr(api, name)
        assert name in dir(attnscope) and name in attnscope.__all__
    with pytest.raises(AttributeError):
        attnscope.no_such_name  # noqa: B018


HEAVY = "print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))"
# a result's faces: `attnscope info`'s JSON, through its view, which imports its own room and no other
SHOWN = (
    "from attnscope.analyses.info import InfoResult; InfoResult({'name': 'x'}).to_json(); "
    "print(sorted(m for m in sys.modules if m.startswith('attnscope.output.') and m.count('.') == 2))"
)
ROOMS = ["documents", "files", "info", "notebook", "scales", "views"]  # the shared builders it uses, and its room


@pytest.mark.parametrize("module", ["attnscope", "attnscope.api", "attnscope.analyses.result"])
def test_importing_the_package_or_its_api_imports_no_heavy_library(module):
    """A notebook's `import attnscope` costs nothing: torch and transformers come with the first call, and a
    result's faces never bring matplotlib unless a picture is drawn; showing one result loads the room of its
    command (output/<command>.py) and no other."""
    shown = module.endswith("result")
    code = f"import sys, {module}; " + (f"{SHOWN}; " if shown else "") + HEAVY
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "[]"
    if shown:
        assert lines[0] == str([f"attnscope.output.{name}" for name in ROOMS])


def test_only_the_cli_imports_typer_or_click():
    users = sorted(
        str(path.relative_to(ROOT))
        for path, module in _package_modules()
        for target, _ in _imports(path, module)
        if target.split(".")[0] in ("typer", "click")
    )
    assert users and all(user.startswith("attnscope/cli/") for user in users)


def test_help_does_not_import_heavy_libraries():
    heavy = ("torch", "transformers", "matplotlib")
    code = f"import sys, attnscope.cli; print(sorted(m for m in {heavy!r} if m in sys.modules))"  # every command built
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    helped = subprocess.run(
        [sys.executable, "-m", "attnscope", "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert helped.returncode == 0, helped.stderr
    listed = [line.split()[0] for line in helped.stdout.split("Commands:")[1].splitlines() if line.strip()]
    from attnscope import registry

    assert listed == [command.name for command in registry.COMMANDS]  # in the registry's order


def test_tests_share_code_only_through_support():
    wrong = []
    for path in sorted(TESTS.rglob("*.py")):
        if "data" in path.relative_to(TESTS).parts:
            continue
        module = _module_name(path, ROOT)
        for target, line in _imports(path, module):
            if target.split(".")[0] != "tests":
                continue
            if target in ("tests", "tests.support") or target.startswith("tests.support."):
                continue
            wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert wrong == []
