"""The API's stubs (attnscope/api.pyi, attnscope/__init__.pyi) cannot drift from the code: each is what
scripts/generate_stubs.py makes now, the signatures they give are the functions' own at run time (read here from the
stub's syntax tree, apart from the generator), every name the package offers is in the package's stub, and a package
built from the checkout ships them with py.typed. tests/e2e/test_typed_api.py runs mypy against them."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import sys
from functools import cache
from pathlib import Path

import pytest

import attnscope
from attnscope import api, options, settings

ROOT = Path(__file__).resolve().parents[2]


@cache
def generator():
    spec = importlib.util.spec_from_file_location("generate_stubs", ROOT / "scripts" / "generate_stubs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@cache
def stub_functions(path: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("stub", ["attnscope/api.pyi", "attnscope/__init__.pyi"])
def test_the_stubs_kept_in_the_repository_are_what_the_code_declares(stub):
    kept = (ROOT / stub).read_text(encoding="utf-8")
    assert generator().STUBS[stub]() == kept, f"{stub} is stale: run python scripts/generate_stubs.py"


@pytest.mark.parametrize("command", sorted(api.COMMANDS))
def test_a_commands_stub_has_the_signature_it_has_at_run_time(command):
    """Names, order, kinds, defaults: what `help()` shows is what a type checker reads; each keyword typed."""
    function = api.COMMANDS[command]
    node = stub_functions("attnscope/api.pyi")[function.__name__]
    arguments = node.args
    assert not arguments.posonlyargs and arguments.vararg is None and arguments.kwarg is None
    positional, keyword = arguments.args, arguments.kwonlyargs
    shown = [(argument.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD) for argument in positional]
    shown += [(argument.arg, inspect.Parameter.KEYWORD_ONLY) for argument in keyword]
    parameters = inspect.signature(function).parameters.values()
    assert shown == [(parameter.name, parameter.kind) for parameter in parameters]
    defaults = dict(zip([argument.arg for argument in positional][::-1], arguments.defaults[::-1], strict=False))
    defaults |= {argument.arg: value for argument, value in zip(keyword, arguments.kw_defaults, strict=True) if value}
    for parameter in parameters:
        if parameter.default is inspect.Parameter.empty:
            assert parameter.name not in defaults, (command, parameter.name)
        elif not isinstance(defaults[parameter.name], ast.Constant) or defaults[parameter.name].value is not ...:
            assert ast.literal_eval(defaults[parameter.name]) == parameter.default, (command, parameter.name)
    assert all(argument.annotation is not None for argument in positional + keyword)
    assert ast.unparse(node.returns) == inspect.signature(function).return_annotation
    assert ast.get_docstring(node) == inspect.getdoc(function)


def test_the_stubs_type_each_domain_as_its_check_takes_it():
    node = stub_functions("attnscope/api.pyi")["heads"]
    types = {argument.arg: ast.unparse(argument.annotation) for argument in node.args.args + node.args.kwonlyargs}
    assert types["window"] == "int" and types["top"] == "int | None" and types["probe"] == "bool"
    assert types["plot"] == "str | Sequence[str]" and types["file"] == "str | os.PathLike[str] | None"
    assert types["dtype"] == "Literal['auto', 'float32', 'float16', 'bfloat16']"
    assert types["device_map"] == "Literal['auto', 'balanced', 'sequential'] | None"
    assert types["model"] == "LoadedModel | str | os.PathLike[str]"
    assert types["thresholds"] == "Mapping[str, float] | Sequence[str] | None"
    bench = stub_functions("attnscope/api.pyi")["bench"].args.args[0]
    assert ast.unparse(bench.annotation) == "str | os.PathLike[str]"  # bench loads its model itself: a name
    report = stub_functions("attnscope/api.pyi")["report"].args.args[0]
    assert ast.unparse(report.annotation).endswith("| Sequence[LoadedModel | str | os.PathLike[str]] | None")


def test_a_domain_without_a_python_type_is_refused():
    weird = settings.Setting(options.Option("weird"), "A setting of a domain the generator does not know.", name="x")
    with pytest.raises(ValueError, match="x: no Python type for its domain"):
        generator().annotation(weird, settings.Heads)


def test_the_package_stub_offers_every_name_the_package_does():
    tree = ast.parse((ROOT / "attnscope/__init__.pyi").read_text(encoding="utf-8"))
    offered = {alias.asname for node in tree.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert offered | {"__version__"} == set(attnscope.__all__)
    assert "__getattr__" not in stub_functions("attnscope/__init__.pyi")  # a misspelt name stays an error


def test_the_package_ships_its_stubs_and_py_typed():
    """py.typed: a type checker reads an installed package's types (PEP 561); the wheel test builds one."""
    assert (ROOT / "attnscope" / "py.typed").is_file()
    project = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    package_data = re.search(r"^attnscope = \[(.*)\]$", project, re.MULTILINE).group(1)
    assert '"py.typed"' in package_data and '"*.pyi"' in package_data
    assert re.search(r'^test = \[.*"mypy>=', project, re.MULTILINE)
