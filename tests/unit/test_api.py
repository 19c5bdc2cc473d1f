"""The Python API's surface, without a model: every command is one function, and every option of the command line
comes from the one declaration of the function's keyword (name, default, domain, help); the same values are refused
in the same words both ways; thresholds take Python's forms; a result's notebook HTML is a self-contained, escaped
fragment in the catalog's colours (on hand-built results with known roles)."""

from __future__ import annotations

import inspect
import re
import typing
from html.parser import HTMLParser

import numpy as np
import pytest

from attnscope import api, cli, settings
from attnscope.analyses.attend import AttendResult
from attnscope.analyses.heads import Heads
from attnscope.analyses.scoring import HeadRecord, HeadsResult
from attnscope.cli.declare import OptionError
from attnscope.errors import AttnscopeError
from attnscope.output.destination import Drawing, Output
from attnscope.output.notebook import html
from attnscope.output.views import view_of
from attnscope.pipeline.labels import Labels
from attnscope.scores import catalog
from attnscope.scores.kinds import DECODER
from attnscope.scores.roles import Role, parse_thresholds

COMMANDS = api.COMMANDS


def _cli_parameters(command: str) -> dict[str, inspect.Parameter]:
    function = next(
        info.callback
        for info in cli.app.registered_commands
        if (info.name or info.callback.__name__.replace("_", "-")) == command
    )
    return dict(inspect.signature(function).parameters)


def _option_info(parameter: inspect.Parameter):
    return typing.get_args(parameter.annotation)[1]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_of_a_command_is_the_declaration_of_a_keyword_of_its_function(command):
    """One declaration per setting: the command's options are its function's keywords (those the command line
    has) and the output options, in that order, each with the names, help and default its declaration gives; the
    function's signature has the same keywords with the same defaults. A new setting is one new field."""
    function = COMMANDS[command]
    declared = [item for item in api.keywords(function.settings) if item.command_line]
    output = (Drawing if function.settings.draws else Output).declarations()
    parameters = _cli_parameters(command)
    assert list(parameters) == [item.name for item in declared + output]
    signature = inspect.signature(function).parameters
    for item in declared + output:
        info = _option_info(parameters[item.name])
        assert info.help == item.help, (command, item.name)
        if item.argument:
            assert info.metavar == item.metavar
            continue
        names = " ".join(str(name) for name in (info.default, *info.param_decls))  # typer keeps the first in default
        assert all(flag.split("/")[0] in names for flag in item.options), (command, item.name, names)
        default = parameters[item.name].default
        if item.many:  # repeated: left out means the function's default
            assert default is None or default == [item.default], (command, item.name)
        elif not item.required:  # a tuple of numbers as typed: the parser reads it
            parser = info.parser or (lambda value: value)
            assert parser(default) == item.default, (command, item.name)
        if item in declared:
            python = signature[item.name].default
            assert python == (inspect.Parameter.empty if item.required else item.default), (command, item.name)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_keyword_is_documented_in_the_functions_help(command):
    function = COMMANDS[command]
    lines = inspect.getdoc(function).splitlines()
    documented = {line.split()[0] for line in lines if line and not line[0].isspace()}
    missing = [name for name in inspect.signature(function).parameters if name not in documented]
    assert missing == [], f"{command}: undocumented keywords {missing}"
    for item in function.settings.declarations():
        line = next(line for line in lines if line and not line[0].isspace() and line.split()[0] == item.name)
        assert item.spelled in " ".join(lines[lines.index(line) : lines.index(line) + 4]), (command, item.name)


def test_loads_help_lists_its_keywords_in_one_column():
    """`load`'s loading keywords come from their declarations (settings.Loading), aligned with its own `lm_head`."""
    lines = inspect.getdoc(api.load).splitlines()
    documented = {line.split()[0] for line in lines if line and not line[0].isspace()}
    assert set(inspect.signature(api.load).parameters) - {"name"} <= documented
    assert all(line == line.lstrip() for line in lines[:2])  # the summary, not indented


def test_an_unknown_keyword_is_a_type_error_as_python_says_it():
    with pytest.raises(TypeError, match=r"^heads\(\): got an unexpected keyword argument 'windw'$"):
        api.heads("demo", windw=3)
    with pytest.raises(TypeError, match=r"^random_mha\(\): too many positional arguments$"):
        api.random_mha(64)


def test_the_api_defaults_are_the_settings_defaults():
    """The keywords' defaults are the settings' own: the settings built from every keyword at its default are the
    settings built from none."""
    python = inspect.signature(api.heads).parameters
    given = {item.name: python[item.name].default for item in settings.Heads.declarations()}
    assert Heads(**given) == Heads()


def test_thresholds_take_a_mapping_or_role_equals_value_strings():
    strings = parse_thresholds(["previous-token=0.6", "induc=0.7"])
    assert parse_thresholds({"previous-token": 0.6, "induction": 0.7}) == strings
    assert parse_thresholds({"prev": 0.6, "induction": "0.7"}) == strings
    assert parse_thresholds("previous-token=0.6") == parse_thresholds(["previous-token=0.6"])
    assert parse_thresholds({}) == catalog.DEFAULT_THRESHOLDS
    assert Heads(thresholds={"prev": 0.6}).thresholds == Heads(thresholds=["previous-token=0.6"]).thresholds
    assert Heads(thresholds={"prev": 0.6}).thresholds["previous-token"] == 0.6


@pytest.mark.parametrize(
    "given, message",
    [
        ({"nonsense": 0.5}, "threshold 'nonsense=0.5': expected ROLE=VALUE"),
        ({"mixed": 0.5}, "threshold 'mixed=0.5': expected ROLE=VALUE"),
        ({"broad": 1.5}, "threshold 'broad=1.5': thresholds lie between 0 and 1"),
        ({"broad": None}, "threshold 'broad=None': 'None' is not a number"),
        ({"broad": float("nan")}, "threshold 'broad=nan': thresholds lie between 0 and 1"),
    ],
)
def test_a_bad_threshold_mapping_is_the_same_one_line(given, message):
    with pytest.raises(AttnscopeError) as raised:
        Heads(thresholds=given)
    assert str(raised.value).startswith(message)


# -------------------------------------------------------------------------------------------- notebook HTML

# What a fragment may hold: tables, text containers, inline styles. No script, no link, no picture, no form.
ALLOWED_TAGS = {"div", "span", "table", "thead", "tbody", "tr", "th", "td"}
HOSTILE = "<script>alert('x')</script> & co"


class _Fragment(HTMLParser):
    """Every tag, attribute and piece of text of an HTML fragment, and whether its tags are balanced."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags, self.attributes, self.text, self.open = [], [], [], []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes.extend(attrs)
        self.open.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open.pop() == tag, f"</{tag}> closes nothing open"

    def handle_data(self, data):
        self.text.append(data)


def _parse(fragment: str) -> _Fragment:
    parsed = _Fragment(fragment)
    assert parsed.open == []
    assert set(parsed.tags) <= ALLOWED_TAGS, set(parsed.tags) - ALLOWED_TAGS
    assert {name for name, _ in parsed.attributes} <= {"style", "title", "class"}
    assert re.search(r"&(?!(amp|lt|gt|quot|#x27);)", fragment) is None, "a bare & in the fragment"
    assert "url(" not in fragment and "http" not in fragment  # nothing fetched
    return parsed


def _heads_result(roles: dict[tuple[int, int], str], name: str = "tiny") -> HeadsResult:
    """Two layers of two heads with the roles given, each decided by its own score at 0.9."""
    heads = []
    for (layer, head), role in sorted(roles.items()):
        metric = catalog.ROLE[role].score or "entropy_normalized"
        scores = {score: 0.1 for score in catalog.SCORE_NAMES} | {metric: 0.9, "next_token": None, "last_token": None}
        heads.append(HeadRecord(layer, head, scores, Role(role, metric, 0.9)))
    model = {"name": name, "kind": "decoder", "n_layer": 2, "n_head": 2, "n_kv_head": 2}
    inputs = {"n_texts": 1, "n_windows": 1, "n_tokens": 9, "bos": True, "sources": [HOSTILE]}
    return HeadsResult(model, DECODER, inputs, {}, heads, catalog.SCORE_NAMES, notes=[HOSTILE])


def test_the_role_map_is_a_grid_in_the_catalogs_colours_with_a_legend_of_the_roles_present():
    roles = {(0, 0): "previous-token", (0, 1): "first-token", (1, 0): "induction", (1, 1): "previous-token"}
    fragment = html(view_of(_heads_result(roles)))
    parsed = _parse(fragment)
    cells = {}
    for attrs in _cells_with_titles(fragment):
        label = attrs["title"].split()[0]
        if "." in label:  # the role map's cells (the table's role cells are titled by their role alone)
            cells[label] = re.search(r"background:(#\w+);color:(#\w+)", attrs["style"]).groups()
    expected = {
        f"{layer}.{head}": (catalog.ROLE[role].colour, catalog.ROLE[role].ink) for (layer, head), role in roles.items()
    }
    assert cells == expected
    assert cells["0.1"] == ("#000000", "#ffffff")  # white on the black sink
    # the legend names the three roles present, in the catalog's order, and no other
    legend = [text for text in parsed.text if " = " in text]
    assert legend == ["prev = previous-token", "first = first-token", "induc = induction"]
    assert "Head roles: tiny (1 texts, 9 tokens)" in parsed.text


def _cells_with_titles(fragment: str) -> list[dict[str, str]]:
    found = []

    class Cells(HTMLParser):
        def handle_starttag(self, tag, attrs):
            if tag == "td" and "title" in dict(attrs):
                found.append(dict(attrs))

    Cells().feed(fragment)
    return found


def test_the_heads_table_lists_the_selected_heads_with_the_terminals_columns():
    result = _heads_result({(0, 0): "self", (0, 1): "broad", (1, 0): "local", (1, 1): "mixed"})
    result.selection = {"layer": 1, "sort": None, "top": None}
    parsed = _parse(html(view_of(result)))
    columns = [score.short for score in catalog.table_columns("decoder")]
    text = parsed.text
    assert text[text.index("Heads") + 1 : text.index("Heads") + 4 + len(columns)] == ["head", "role", "by", *columns]
    assert "1.0" in text and "1.1" in text and "0.0" not in text  # layer 1 only in the table
    assert "local_lift" not in text and "lift 0.90" in text  # the deciding score, by its short label


def test_every_text_is_escaped_and_nothing_runs():
    """A model name, a source and a note holding markup are shown as text."""
    fragment = html(view_of(_heads_result({(0, 0): "self", (0, 1): "self", (1, 0): "self", (1, 1): "self"}, HOSTILE)))
    parsed = _parse(fragment)
    assert "script" not in parsed.tags and "<script" not in fragment.lower()
    assert f"note: {HOSTILE}" in parsed.text
    assert any(HOSTILE in text for text in parsed.text)


def test_attend_html_escapes_its_tokens_and_shades_its_grid():
    tokens = ["<bos>", "<script>", " &", "a"]
    rows = np.zeros((1, 2, 4))  # (L, H, n): head 0 on "<script>", head 1 spread
    rows[0, 0] = [0.0, 1.0, 0.0, 0.0]
    rows[0, 1] = [0.25, 0.25, 0.25, 0.25]
    model = {"name": HOSTILE, "kind": "decoder", "n_layer": 1, "n_head": 2}
    settings = {"from_index": 0, "to_index": None, "tokens": 2, "top": 2, "index": 0}
    shown = ["<bos>", "<script>", "&", "a"]
    labels = Labels(tokens, shown, [range(k, k + 1) for k in range(4)], shown)
    result = AttendResult(model, settings, labels, "a", [3], rows, "<script>", [range(1, 2)], rows[..., [1]].sum(-1))
    fragment = html(view_of(result))
    parsed = _parse(fragment)
    assert "<script" not in fragment.lower()
    assert "Attention from a@3 to <script>@1" in parsed.text
    assert "<script>@1: 1.00, <bos>@0: 0.00" in parsed.text
    assert "background:rgba(0,114,178,1.00);color:#fff" in fragment  # the full weight, dark with white text
    assert "background:rgba(0,114,178,0.25)" in fragment


# ---------------------------------------------------------------------------------- the same checks, both ways

# What each command's settings need besides the keyword under test
REQUIRED = {
    "show": {"layer": 0},
    "diversity": {"layer": 0},
    "attend": {"from_token": "cat", "to_token": "mat"},
    "random-mha": {"head_counts": [1]},  # dividing any d_model
    "circuit": {"method": "gradient", "ablation": "resample"},  # --steps are the gradient's, a seed resample's
    "ablate": {"ablation": "resample"},  # --resample-seed is resample ablation's
    "patch": {"clean": "a b", "corrupt": "a c", "answer": "b", "wrong": "c"},
    "discover": {"clean": "a b", "corrupt": "a c", "answer": "b", "wrong": "c", "method": "eap-ig"},
}


def _outside(option) -> list:
    """Values just outside a domain, and a value of the wrong type."""
    if option.kind == "count":
        return [option.low - 1, option.high + 1, float(option.low)]
    if option.kind == "number":
        return [option.low - 0.01, option.high + 0.01, float("nan"), str(option.low)]
    return ["nonsense", 1]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_is_checked_the_same_way_by_the_cli_and_the_api(command):
    """Each setting with a range or choices: the command line's parser and the Python settings (which the function
    builds first) refuse the same values, in the same words but for the option's name, and accept the ends."""
    function = COMMANDS[command]
    parameters = _cli_parameters(command)
    for item in function.settings.declarations():
        option = item.domain
        if option is None or option.kind not in ("count", "number", "choice"):
            continue
        parser = _option_info(parameters[item.name]).parser
        for value in _outside(option):
            with pytest.raises(AttnscopeError) as raised:
                function.settings(**{**REQUIRED.get(command, {}), item.name: value})
            assert str(raised.value).startswith(f"{item.name} "), (command, item.name, str(raised.value))
            if isinstance(value, str if option.kind == "choice" else (int, float)):  # what a command line can say
                with pytest.raises(OptionError) as refused:
                    parser(str(value))
                problem = refused.value.message.split(": ", 1)[1]
                assert str(raised.value).split(": ", 1)[1].startswith(problem), (command, item.name, problem)
        ends = [option.low, option.high] if option.kind in ("count", "number") else list(option.choices)
        for value in ends:
            if command == "random-mha" and value == option.high and item.name in ("d_model", "seq_len"):
                continue  # the largest sizes together are refused by random-mha's memory estimate, as they should
            function.settings(**{**REQUIRED.get(command, {}), item.name: value})
            assert parser(str(value)) == value


def test_pictures_take_the_domains_of_format_and_dpi():
    from attnscope import options
    from attnscope.output.files import Pictures

    for name, option in (("format", options.FORMAT), ("dpi", options.DPI)):
        assert _option_info(_cli_parameters("show")[name]).parser.domain is option
    with pytest.raises(AttnscopeError, match="^dpi '300': expected a whole number from 50 to 1,200, not a str$"):
        Pictures(dpi="300")
    with pytest.raises(AttnscopeError, match="^format 'jpg': use one of png, svg, pdf$"):
        Pictures(format="jpg")


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: api.heads("m", window="3"), "window '3': expected a whole number"),
        (lambda: api.heads("m", window=3.5), "window 3.5: expected a whole number"),
        (lambda: api.heads("m", window=float("nan")), "window nan: expected a whole number"),
        (lambda: api.heads("m", batch_size="8"), "batch_size '8': expected a whole number"),
        (lambda: api.heads("m", thresholds=5), "thresholds 5: expected {ROLE: VALUE} or ROLE=VALUE strings"),
        (lambda: api.heads("m", plot=[1]), "plot 1: expected LAYER.HEAD such as 4.11"),
        (lambda: api.heads("m", probe_seed=1.5), "probe_seed 1.5: expected a whole number"),
        (lambda: api.heads("m", probe_seed=2**70), "probe_seed 1180591620717411303424: must be a whole number"),
        (lambda: api.heads("m", layer="1"), "layer '1': expected a whole number from 0"),
        (lambda: api.heads("m", bos="no"), "bos 'no': expected True or False (or None), not a str"),
        (lambda: api.heads("m", words=True), "words (--words) draws the maps of plot (--plot L.H) word by word"),
        (lambda: api.attend("m", from_token=5), "from_token 5: expected a string, not an int"),
        (lambda: api.random_mha(head_counts="1,2"), "head_counts '1,2': expected a list of whole numbers"),
        (lambda: api.random_mha(trials=10**20), "trials 100000000000000000000: must be a whole number from 1"),
        (lambda: api.bench("m", repeats=10**12), "repeats 1000000000000: must be a whole number from 1 to 1,000"),
        (lambda: api.load(None), "model: expected a model from attnscope.load or a name"),
        (lambda: api.load("m", dtype="float99"), "dtype 'float99': use one of auto, float32, float16, bfloat16"),
        (lambda: api.heads("m", progress=5), "progress 5: expected a function"),
        (lambda: api.heads("m", file=3), "file 3: expected the path of a file"),
    ],
)
def test_the_api_refuses_wrong_types_and_values_in_one_line(call, message):
    """Not a TypeError from deep inside, nor a value the CLI would refuse taken as it is (`bos="no"` recorded)."""
    with pytest.raises(AttnscopeError) as raised:
        call()
    assert str(raised.value).startswith(message), str(raised.value)


@pytest.mark.parametrize(
    "out, dpi, message", [(None, None, "out None"), ("", None, "out ''"), (".", "300", "dpi '300'")]
)
def test_save_refuses_what_the_cli_refuses(tmp_path, monkeypatch, out, dpi, message):
    monkeypatch.chdir(tmp_path)
    result = api.random_mha(d_model=8, head_counts=(1, 2), seq_len=4, trials=1)
    with pytest.raises(AttnscopeError, match=f"^{re.escape(message)}"):
        result.save(out, dpi=dpi)
    assert list(tmp_path.iterdir()) == []


def test_the_promises_page_lists_the_bounds_of_every_number_option():
    """docs/promises.md's table of bounds says what the options check: the table is made from the settings'
    declarations (docs/hooks/generate.py), read here the other way, from the command line's options."""
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "promises.md").read_text(encoding="utf-8")
    rows = []
    for line in page.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`--"):
            flags = re.findall(r"`(--[\w-]+)`", cells[0])
            first = [re.match(r"[\d,.]+", cell).group().replace(",", "") for cell in cells[2:4]]
            rows.append((flags, {name.strip() for name in cells[1].split(",")}, *(float(v) for v in first)))
    for info in cli.app.registered_commands:
        command = info.name or info.callback.__name__
        for parameter in inspect.signature(info.callback).parameters.values():
            parser = getattr(_option_info(parameter), "parser", None) if typing.get_args(parameter.annotation) else None
            option = getattr(parser, "domain", None)
            if option is None or option.kind not in ("count", "number"):
                continue
            declared = typing.get_args(parameter.annotation)[1]
            flag = max((d for d in (declared.default, *declared.param_decls) if str(d).startswith("--")), key=len)
            listed = [
                (low, high)
                for flags, commands, low, high in rows
                if flag in flags and (command in commands or commands == {"every command that draws"})
            ]
            assert (float(option.low), float(option.high)) in listed, (command, flag, listed)
