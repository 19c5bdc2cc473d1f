"""Settings declared once (attnscope.settings, attnscope.options): a declaration gives the field's check, the Python
keyword with its docstring line and the command line's option; a head is `L.H` (or TransformerLens's `L4H11`)
everywhere; the commands' contract is class attributes with defaults; a settings class refuses what its command
refuses, before any model."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

from attnscope import api, options, settings
from attnscope.errors import AttnscopeError
from attnscope.models.checks import Shape


@pytest.mark.parametrize(
    "given, label", [("4.11", "4.11"), (" 4.11 ", "4.11"), ("L4H11", "4.11"), ("l0h3", "0.3"), ("L12H0", "12.0")]
)
def test_a_head_is_l_dot_h_or_transformerlens_spelling_stored_as_l_dot_h(given, label):
    assert options.HEAD.check(given, "head") == label
    assert options.HEAD.parse(given) == label
    assert options.head_of(given) == tuple(int(part) for part in label.split("."))


@pytest.mark.parametrize("given", ["4", "4-11", "L4", "4.11.2", "L4H", "H4L11", "", "4.x", "-1.0", 4.11, None])
def test_anything_else_is_not_a_head(given):
    with pytest.raises(AttnscopeError, match=r"expected LAYER\.HEAD such as 4\.11 \(or L4H11"):
        options.HEAD.check(given, "head")


def test_a_head_out_of_the_models_range_is_named_with_the_range():
    assert options.head_in("L1H3", 2, 4) == (1, 3)
    with pytest.raises(AttnscopeError, match=r"^head '2.0': layer 2 is out of range \(this model has layers 0-1\)$"):
        options.head_in("2.0", 2, 4)
    with pytest.raises(AttnscopeError, match=r"^head 'L1H4': head 4 is out of range \(this model has heads 0-3\)$"):
        options.head_in("L1H4", 2, 4)


def test_heads_given_several_times_are_one_list_each_once_in_order():
    assert options.HEADS.check(["1.2", "L0H1", "1.2"], "plot") == ("1.2", "0.1")
    assert options.HEADS.check("L1H0", "plot") == ("1.0",) and options.HEADS.check(None, "plot") == ()
    assert settings.Circuit(head=["L1H2", "1.0"]).head == ("1.2", "1.0")


def test_heads_to_remove_are_comma_separated_or_repeated_each_once_in_order():
    assert options.HEAD_SET.parse("0.2, L1H0,0.2") == ("0.2", "1.0", "0.2")  # one occurrence; the check dedupes
    assert options.HEAD_SET.check([("0.2", "1.0"), ("0.2",), "1.3"], "remove") == ("0.2", "1.0", "1.3")  # repeated
    assert settings.Ablate(remove="0.2,L1H3").remove == ("0.2", "1.3") and settings.Ablate().remove == ()
    with pytest.raises(AttnscopeError, match=r"^remove '1\.x': expected LAYER\.HEAD"):
        settings.Ablate(remove=["0.2", "1.x"])
    with pytest.raises(AttnscopeError, match=r"^,: expected LAYER\.HEAD such as 4\.11 .*, comma-separated$"):
        options.HEAD_SET.parse(",")


def test_ablation_is_declared_once_for_ablate_and_circuit():
    for command in (settings.Ablate, settings.Circuit):
        declared = {item.name: item for item in command.declarations()}
        assert declared["ablation"] is not None and declared["ablation"].default == "mean"
        assert declared["ablation"].domain is options.ABLATION and declared["resample_seed"].domain is options.SEED
        assert command(ablation="resample", resample_seed=7).resample_seed == 7
        with pytest.raises(AttnscopeError, match=r"^ablation 'half': use one of zero, mean, resample$"):
            command(ablation="half")
        with pytest.raises(
            AttnscopeError, match=r"^resample_seed \(--resample-seed\) seeds .*: give ablation resample"
        ):
            command(resample_seed=7)
    owners = {klass for klass in settings.Ablate.__mro__ if "ablation" in vars(klass).get("__annotations__", {})}
    assert owners == {settings.Removal} and issubclass(settings.Circuit, settings.Removal)


def test_show_takes_a_head_or_a_layer_and_a_head_says_its_layer():
    assert (settings.Show(head="L1H2").layer, settings.Show(head="L1H2").head) == (1, "1.2")
    assert settings.Show(layer=1, head="1.2").layer == 1 and settings.Show(layer=0).head is None
    with pytest.raises(AttnscopeError, match=r"^head 1\.2 is in layer 1, not layer 0: give one$"):
        settings.Show(layer=0, head="1.2")
    with pytest.raises(AttnscopeError, match=r"^layer or head \(--layer L, --head L\.H\): say what to draw$"):
        settings.Show()
    with pytest.raises(AttnscopeError, match=r"^head '1\.4': head 4 is out of range"):
        settings.Show(head="1.4").check_shape(Shape(2, 4, "decoder"))


def test_a_layer_or_all_reads_all_as_every_layer():
    assert options.LAYER_OR_ALL.parse("all") == "all"  # a required option given must not read as missing
    assert settings.Diversity(layer="all").layer is None and settings.Diversity(layer="ALL").layer is None
    assert settings.Diversity(layer="3").layer == 3 and settings.Diversity(layer=None).layer is None
    with pytest.raises(AttnscopeError, match=r"^layer 'every': expected a layer number \(0-based\) or 'all'$"):
        settings.Diversity(layer="every")


def test_comma_separated_numbers_and_names_keep_their_order_each_once():
    assert options.BENCH_SEQ_LENS.parse("512,128,512") == (512, 128)
    assert settings.Bench(seq_lens=[128, 64]).seq_lens == (128, 64)
    assert settings.RandomMha(head_counts=(8, 1, 2, 1)).head_counts == (1, 2, 8)  # ascending: the plot's axis
    assert options.BENCH_METHOD_NAMES.parse("floor, attnscope,floor") == ("floor", "attnscope")
    with pytest.raises(AttnscopeError, match="^5000: must be a whole number from 1 to 4,096"):
        options.HEAD_COUNTS.parse("1,5000")


def test_every_setting_is_one_declaration_with_its_name_default_and_a_line_of_help():
    """Every field of every command's settings is declared (a domain or a check of its own, a default, a help),
    its docstring line names it and its option, and the declarations a command shares are the same objects."""
    for function in api.COMMANDS.values():
        declared = function.settings.declarations()
        names = [item.name for item in declared]
        assert sorted(names) == sorted(field.name for field in dataclasses.fields(function.settings))
        for item in declared:
            assert item.help.strip().endswith((".", ")")), (function.__name__, item.name)
            line = item.docstring_line()
            assert line.startswith(item.name) and item.spelled in " ".join(line.split()), line
        assert names[-1] in {"kernel", "device_map", "revision", "dtype", "seed", "sample_rows"}  # own first
    window = {function.settings.__name__: function.settings.declarations() for function in api.COMMANDS.values()}
    heads, circuit = window["Heads"], window["Circuit"]
    assert next(i for i in heads if i.name == "window") == next(i for i in circuit if i.name == "window")


def test_the_contract_is_class_attributes_with_defaults():
    """What the runners read (never a getattr guess): the defaults on `Settings`, each command's own."""
    contract = {
        name: (
            function.settings.models,
            function.settings.reads_texts,
            function.settings.draws,
            function.settings.default_out,
        )
        for name, function in api.COMMANDS.items()
    }
    assert contract["heads"] == (settings.ONE, True, True, None)
    assert contract["show"] == (settings.ONE, True, True, ".")
    assert contract["report"] == (settings.SEVERAL, True, False, "attnscope-report")
    assert contract["compare"][:2] == (settings.SEVERAL, True)
    assert contract["bench"][:2] == contract["info"][:2] == (settings.OWN, False)
    assert contract["random-mha"][:2] == (settings.NONE, False)
    assert not settings.Heads().needs_lm_head and settings.Ablate().needs_lm_head
    assert settings.Circuit().needs_lm_head and not settings.Circuit(weights=False).needs_lm_head
    assert settings.Report(ablate=True).needs_lm_head and not settings.Report().needs_lm_head
    with pytest.raises(AttnscopeError, match="this command analyses one model; 2 were given"):
        settings.Heads().check_models(2)


def test_the_functions_signature_is_made_from_the_declarations():
    signature = inspect.signature(api.diversity)
    assert list(signature.parameters)[:3] == ["model", "texts", "layer"]
    assert signature.parameters["layer"].default is inspect.Parameter.empty  # required, as --layer is
    assert signature.parameters["model"].default == "gpt2"
    assert signature.parameters["batch_size"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "head_counts" in inspect.signature(api.random_mha).parameters
    assert "texts" not in inspect.signature(api.bench).parameters
    assert "kernel" not in inspect.signature(api.ablate).parameters
    assert "revision" not in inspect.signature(api.compare).parameters  # one revision for every model: not offered
    assert "device_map" not in inspect.signature(api.info).parameters


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: settings.Heads(sort="next_token").check_shape(Shape(2, 4, "decoder")), "sort by next_token: that"),
        (lambda: settings.Circuit(score="induction", probe=False).check_shape(Shape(2, 4, "decoder")), "probe"),
        (lambda: settings.Compare(score="last").check_shape(Shape(2, 4, "decoder")), "score last_token: that score"),
        (lambda: settings.Circuit(head="0.1").check_shape(Shape(2, 4, "decoder")), "it is in layer 0"),
        (lambda: settings.Ablate(prune=9).check_shape(Shape(2, 4, "decoder")), "prune 9: this model has 8 heads"),
        (lambda: settings.Ablate(remove="1.5").check_shape(Shape(2, 4, "decoder")), "head '1.5': head 5 is out of"),
        (
            lambda: settings.Ablate(prune=7, remove="0.1,0.2").check_shape(Shape(2, 4, "decoder")),
            "prune 7: 6 heads left once",
        ),
        (lambda: settings.Report(circuit=True).check_models(2), "explains one model's heads"),
        (lambda: settings.Compare(revisions="a,a"), "revision 'a' is given twice"),
    ],
)
def test_what_a_setting_asks_of_a_model_is_refused_from_its_config(build, message):
    with pytest.raises(AttnscopeError, match=message):
        build()


@pytest.mark.parametrize("given", [0.7499999999999999, np.float32(0.75), 0.7500000001])
def test_a_streaming_share_is_applied_as_the_json_records_it(given):
    """Six decimals, as the JSON writes it: floor(share × 8 KV heads) is then 6, the plan the file describes, where
    the float given would floor to 5."""
    from attnscope.analyses.kv_plans import streaming_heads

    share = settings.Kvplan(streaming=given).streaming
    assert share == 0.75 and streaming_heads(8, share) == 6


def test_a_share_given_as_text_from_python_is_refused_as_a_number_given_as_text_is():
    """streaming='0.5' was taken while sink='16' was refused: from Python a number is a number."""
    with pytest.raises(AttnscopeError, match="^streaming '0.5': expected a number from 0 to 1, or 'auto', not a str"):
        settings.Kvplan(streaming="0.5")
    with pytest.raises(AttnscopeError, match="^sink '16': expected a whole number"):
        settings.Kvplan(sink="16")
    assert settings.Kvplan(streaming="auto").streaming == "auto" and options.STREAMING.parse("0.25") == 0.25


def test_a_folder_that_is_not_a_path_is_named_for_what_it_is():
    """ablate(save=5) once said 'an empty folder name'."""
    with pytest.raises(AttnscopeError, match="^save 5: expected a folder's path, not an int"):
        settings.Ablate(remove=["0.1"], save=5)


def test_saving_alone_scores_no_head_unless_scores_are_asked_for(tmp_path):
    """`ablate --remove H --save DIR` scored every head first (270 ablations on a 30-layer model) to save one model:
    alone, --save scores none; --score, --prune (which ranks the heads) and method gradient ask for the scores."""
    save = {"remove": "0.1", "save": tmp_path / "model"}
    assert settings.Ablate().scoring and not settings.Ablate(**save).scoring
    assert settings.Ablate(**save, score=True).scoring and settings.Ablate(**save, prune=2).scoring
    assert settings.Ablate(**save, method="gradient").scoring and not settings.Ablate(score=False).scoring
    with pytest.raises(AttnscopeError, match=r"^prune \(--prune 2\) removes the least important heads, and score "):
        settings.Ablate(score=False, prune=2)
    with pytest.raises(AttnscopeError, match=r"^method gradient \(--method gradient\) is a way of scoring every head"):
        settings.Ablate(**save, score=False, method="gradient")
