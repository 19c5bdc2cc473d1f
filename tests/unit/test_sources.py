"""Where a run's models come from (attnscope.models.sources and the API's resolution): one labelling rule, one rule
for a model given twice (however it is spelled), revisions parsed once, the same for report and compare."""

from __future__ import annotations

import os

import pytest

from attnscope import api, settings
from attnscope.errors import AttnscopeError
from attnscope.models.sources import check_once, labels


def test_labels_are_folder_names_told_apart_by_their_parents_then_by_place(tmp_path):
    for name in ("run1/final", "run2/final", "step-1", "step-2"):
        (tmp_path / name).mkdir(parents=True)
    finals = [str(tmp_path / "run1" / "final"), str(tmp_path / "run2" / "final")]
    shown, note = labels(finals, [None, None])
    assert shown == ["run1/final", "run2/final"] and "final as run1/final" in note
    steps = [str(tmp_path / "step-1"), str(tmp_path / "step-2") + "/", "gpt2"]
    assert labels(steps, [None] * 3) == (["step-1", "step-2", "gpt2"], None)
    assert labels(["gpt2", "gpt2"], ["step0", "step512"]) == (["step0", "step512"], None)  # revisions name them
    shown, note = labels(["demo", "demo"], [None, None])  # two models of one name (loaded, changed in memory)
    assert shown == ["demo", "demo#2"] and "demo as demo#2" in note


def test_a_model_given_twice_is_refused_however_it_is_spelled(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    os.symlink(folder, tmp_path / "link")
    same = [str(folder), str(folder) + "/", str(tmp_path / "link"), f"{tmp_path}/./model"]
    for other in same[1:]:
        with pytest.raises(AttnscopeError, match="is given twice.*give each model once"):
            check_once([same[0], other], [None, None])
    with pytest.raises(AttnscopeError, match="^model 'gpt2 at step0' is given twice"):
        check_once(["gpt2", "demo", "gpt2"], ["step0", None, "step0"])
    check_once(["gpt2", "gpt2"], ["step0", "step1"])  # two revisions of one model: two models
    check_once(["demo", str(folder)], [None, None])


@pytest.mark.parametrize("command", [settings.Report, settings.Compare])
def test_report_and_compare_resolve_their_models_alike(command, tmp_path):
    """The same rules in both commands: revisions of one model by name, each once, a model given twice refused."""
    sources, note = api.model_sources("EleutherAI/pythia-14m", command(revisions="step0, step512"), None)
    assert [(source.label, source.name, source.revision) for source in sources] == [
        ("step0", "EleutherAI/pythia-14m", "step0"),
        ("step512", "EleutherAI/pythia-14m", "step512"),
    ] and note is None
    with pytest.raises(AttnscopeError, match="^model 'demo' is given twice"):
        api.model_sources(["demo", "demo"], command(), None)
    with pytest.raises(AttnscopeError, match="revision 'step0' is given twice"):
        command(revisions="step0,step0")
    for wrong in ("step0,,step1", [], [3], 5):
        with pytest.raises(AttnscopeError, match="^revisions "):
            command(revisions=wrong)
    with pytest.raises(AttnscopeError, match="revisions of one model given by name .* 2 models were given"):
        api.model_sources(["a/b", "c/d"], command(revisions="step0"), None)
    with pytest.raises(AttnscopeError, match="'demo' is the demo model bundled with attnscope, which has no revisions"):
        api.model_sources("demo", command(revisions="step0"), None)
