"""Every command end to end on a tiny model of every supported family (tests.support.FAMILY_MODELS), through the
real CLI: each runs, and its JSON says what the model is (family, kind, key/value heads) and holds every head."""

from __future__ import annotations

import json

import pytest

from attnscope.models.loading import load_model
from attnscope.pipeline.labels import token_labels
from attnscope.pipeline.tokens import tokenize
from tests.support import FAMILY_MODELS, FAMILY_TEXTS

EVERYDAY = {"llama", "modernbert"}
FAMILY_NAMES = [
    pytest.param(name, marks=() if name in EVERYDAY else pytest.mark.slow, id=name) for name in FAMILY_MODELS
]
TEXT = FAMILY_TEXTS[0].text


def _json(cli, *args):
    code, out, err = cli(*args, "--json", "-q")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.slow  # over 0.5 s in the quick loop (its minute): the full suite runs it
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_every_command_on_every_family(cli, family_dir, name, tmp_path):
    folder = str(family_dir(name))
    model = load_model(folder, "cpu")
    m = ["-m", folder, "--device", "cpu"]

    heads = _json(cli, "heads", TEXT, *m, "--probe-len", "5")
    facts = heads["model"]
    assert (facts["family"], facts["kind"], facts["model_type"]) == (model.family.name, model.kind.name, name)
    assert facts["n_kv_head"] == model.n_kv_head and facts["d_head"] == model.d_head
    group = model.n_head // model.n_kv_head
    assert [(h["layer"], h["head"], h["kv_head"]) for h in heads["heads"]] == [
        (layer, head, head // group) for layer in range(model.n_layer) for head in range(model.n_head)
    ]
    probe_scores = [h["induction"] for h in heads["heads"]]
    assert all(value is not None for value in probe_scores) == model.kind.probe

    shown = _json(cli, "show", TEXT, *m, "--layer", str(model.n_layer - 1))
    assert len(shown["maps"]) == model.n_head and len(shown["maps"][0]) == shown["input"]["n_tokens"]

    diversity = _json(cli, "diversity", TEXT, *m, "--layer", "all")
    assert len(diversity["labels"]) == model.n_layer * model.n_head

    [window] = tokenize(model, FAMILY_TEXTS[:1]).windows
    labels = token_labels(model.tokenizer, window.ids)
    last = labels[-2] if not model.kind.causal else labels[-1]  # an encoder's last is [SEP]
    wanted = last.replace("Ġ", " ").replace("▁", " ").strip()
    occurrences = [i for i, label in enumerate(labels) if label.replace("▁", " ").strip() == wanted]
    attended = _json(cli, "attend", TEXT, *m, "--from", wanted, "--from-index", str(len(occurrences) - 1))
    assert attended["from"]["position"] == occurrences[-1]
    assert len(attended["rows"]) == model.n_layer and len(attended["rows"][0]) == model.n_head

    ablated = _json(cli, "ablate", TEXT, *m, "--method", "gradient")
    assert len(ablated["heads"]) == model.n_layer * model.n_head and ablated["baseline_loss"] > 0

    report = _json(cli, "report", TEXT, *m, "--probe-len", "5")
    assert report["heads"]["heads"] == heads["heads"]  # every head: `heads` above had no --top
