"""kvpress (NVIDIA/kvpress) reads attnscope's plan as it reads DuoAttention's published ones, and generates with it:
`attnscope kvplan` writes the plan for a tiny Llama-style model with grouped-query heads (2 layers, 2 KV heads each),
the recipe of docs/kvplan.md (the block marked `<!-- test: kvpress -->`, run as it is written) loads it into a
`DuoAttentionPress` (attnscope.interop.kvpress's `plan_press`: a subclass whose `load_attention_pattern` reads the
plan folder) and answers through kvpress's `kv-press-text-generation` pipeline, and `model.generate` runs with the
press as a context manager, as kvpress's README shows both. At another share than the plan's, the press streams
kvplan's lowest scores; a plan of another shape than the model's is refused in one line.

What the press does (kvpress 0.5.5, `DuoAttentionPress.compress` and `attention_patch`): the context is prefilled with
full attention; after it, every token read or generated sees, in a streaming KV head, the context's first S and last
R keys only (the keys between get a fake key whose attention weight underflows to 0; the cache keeps its size). The
tests compare the generated tokens and logits with a reference written here from that rule alone: attention computed
from scratch, each streaming head's dropped keys masked with -inf (`kept_keys_attention`). With the plan of
attnscope's 0s streaming, the press generates as the reference does and not as full attention; with a plan that
keeps every head full, as plain generation, token for token.

Skipped without kvpress (CI's environment); the generation tests also skip where transformers is outside the range
kvpress pins (0.5.5: < 5.3; its hooks read a `past_key_values` keyword that 5.24 no longer passes).
`bash scripts/kvpress_interop.sh` builds a virtual environment with kvpress and the transformers it pins, and runs
this file there."""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support import TEXTS, build_family_model

kvpress = pytest.importorskip(
    "kvpress", reason="needs kvpress: `bash scripts/kvpress_interop.sh` builds a venv with it and runs this file"
)

import transformers  # noqa: E402  (after the skip: kvpress imports it anyway)
from packaging.requirements import Requirement  # noqa: E402
from packaging.specifiers import SpecifierSet  # noqa: E402


def _pinned_transformers() -> str:
    """The range of transformers that the installed kvpress declares (its package metadata)."""
    for line in importlib.metadata.requires("kvpress") or []:
        requirement = Requirement(line)
        if requirement.name == "transformers" and requirement.marker is None:
            return str(requirement.specifier)
    return ""


PINNED = _pinned_transformers()
generates = pytest.mark.skipif(
    not SpecifierSet(PINNED).contains(transformers.__version__, prereleases=True),
    reason=f"kvpress {importlib.metadata.version('kvpress')} generates with transformers{PINNED}, this is "
    f"{transformers.__version__}: `bash scripts/kvpress_interop.sh` runs these tests in a venv with both",
)

RECIPE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "kvplan.md"
SINK, RECENT = 4, 16
CONTEXT = " ".join([text.text for text in TEXTS] * 2)  # 75 tokens: 55 between the sink and the recent window
QUESTION = "Why?"  # short: kvpress's fake key must lie on the far side of all its queries, rare for many random ones
NEW_TOKENS = 8


def recipe() -> str:
    """The Python block of docs/kvplan.md marked `<!-- test: kvpress -->`: what a user writes."""
    text = RECIPE_PAGE.read_text(encoding="utf-8")
    (code,) = re.findall(r"^<!-- test: kvpress -->\n```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    return code


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """The tests' tiny Llama (tests.support), with a context long enough for kvpress's default 50 new tokens."""
    return build_family_model("llama", tmp_path_factory.mktemp("llama"), max_position_embeddings=256)


@pytest.fixture(scope="module")
def plans(model_folder, tmp_path_factory):
    """streaming share -> the folder `attnscope kvplan --out` wrote, from the real CLI on the long probe."""
    from attnscope.cli import run

    folders = {}
    for streaming in (0.5, 0.0):
        folder = tmp_path_factory.mktemp(f"plan-{streaming}") / "plan"
        arguments = ["kvplan", "--model", model_folder, "--sink", SINK, "--recent", RECENT, "--streaming", streaming]
        assert run([str(argument) for argument in [*arguments, "--out", folder]]) == 0
        folders[streaming] = folder
    return folders


def read_plan(folder: Path) -> tuple[dict, np.ndarray]:
    """config.json and the plan: (layers, KV heads) bool, True where the KV head keeps its whole cache."""
    config = json.loads((folder / "config.json").read_text())
    full = np.loadtxt(folder / "full_attention_heads.tsv", delimiter="\t", ndmin=2)
    assert set(np.unique(full)) <= {0.0, 1.0}
    return config, full.astype(bool)


def planned_press(folder: Path, **options):
    """attnscope's press for the plan in `folder` (attnscope.interop.kvpress), as the recipe builds it."""
    from attnscope.interop.kvpress import plan_press

    return plan_press(folder, **options)


# ------------------------------------------------------------------------------------------------- the reference


def kept_keys_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Causal attention from scratch in which, in each streaming KV head, every query after the context sees the
    context's first `sink` and last `recent` keys, and nothing between: the rule a DuoAttention cache follows, as
    kvpress applies it after a full prefill. `module.kept_keys` = (streaming (H_kv,) bool, sink, recent, context)."""
    streaming, sink, recent, context = module.kept_keys
    B, H, q, d = query.shape  # (B, H, q, d): the last q of the k positions
    group = H // key.shape[1]
    key = key.repeat_interleave(group, dim=1)  # (B, H, k, d), query head h reading KV head h // group
    value = value.repeat_interleave(group, dim=1)  # (B, H, k, d)
    k = key.shape[2]
    rows = torch.arange(k - q, k)[:, None]  # (q, 1) each query's position
    keys = torch.arange(k)[None, :]  # (1, k)
    dropped = (rows >= context) & (keys >= sink) & (keys < context - recent)  # (q, k)
    hidden = (keys > rows) | (streaming.repeat_interleave(group)[:, None, None] & dropped)  # (H, q, k)
    logits = (query @ key.transpose(2, 3)) * scaling  # (B, H, q, k)
    weights = logits.masked_fill(hidden, float("-inf")).softmax(dim=-1)  # (B, H, q, k)
    return (weights @ value).transpose(1, 2).contiguous(), weights  # (B, q, H, d), (B, H, q, k)


def reference_model(folder: Path, plan: Path, context: int):
    """The model at `folder` with `kept_keys_attention` for the plan at `plan` and a context of `context` tokens."""
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("attnscope_kept_keys", kept_keys_attention)
    AttentionMaskInterface.register("attnscope_kept_keys", sdpa_mask)  # built and ignored: the function masks itself
    config, full = read_plan(plan)
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="attnscope_kept_keys")
    for layer, block in enumerate(model.model.layers):
        streaming = torch.from_numpy(~full[layer])
        block.self_attn.kept_keys = (streaming, config["sink_size"], config["recent_size"], context)
    return model


def greedy(model, ids: torch.Tensor, tokenizer, new_tokens: int):
    """transformers' greedy `generate`: (the new tokens (n,), their logits (n, vocab))."""
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
        pad_token_id=tokenizer.pad_token_id, output_logits=True, return_dict_in_generate=True,
    )  # fmt: skip
    return out.sequences[0, ids.shape[1] :], torch.cat(out.logits)


def masked_keys(model) -> list[set[tuple[int, int]]]:
    """Per layer, the (KV head, position) pairs the press hides from what comes after the context."""
    found = []
    for block in model.model.layers:
        batch, heads, positions = block.self_attn.masked_key_indices
        assert set(batch.tolist()) <= {0}
        found.append(set(zip(heads.tolist(), positions.tolist(), strict=True)))
    return found


def expected_masked_keys(full: np.ndarray, context: int) -> list[set[tuple[int, int]]]:
    """What the plan says the press hides: each streaming KV head's keys sink … context - recent - 1."""
    return [
        {(head, position) for head in np.flatnonzero(~row).tolist() for position in range(SINK, context - RECENT)}
        for row in full
    ]


# ------------------------------------------------------------------------------------------------------ the tests


def test_kvpress_streams_exactly_the_plans_kv_heads(model_folder, plans):
    from transformers import AutoModelForCausalLM

    config, full = read_plan(plans[0.5])
    press = planned_press(plans[0.5])
    assert isinstance(press, kvpress.DuoAttentionPress) and type(press).__name__ == "PlanPress"
    assert press.head_compression_ratio == config["sparsity"] == 0.5
    press.post_init_from_model(AutoModelForCausalLM.from_pretrained(model_folder))  # a path: no plan to download
    assert (press.sink_size, press.recent_size) == (config["sink_size"], config["recent_size"]) == (SINK, RECENT)
    assert press.streaming_mask.cpu().numpy().tolist() == (~full).tolist()
    assert 0 < int(press.streaming_mask.sum()) < full.size


@pytest.mark.parametrize("ratio", [0.25, 0.75])
def test_at_another_share_the_press_streams_kvplans_lowest_scores(model_folder, plans, ratio):
    """Below the plan's share, the lowest-scored of its streaming heads; above it, all of them and the lowest-scored
    of its full ones: kvplan's order (score, layer, KV head) from kvplan.json, never numpy's choice among ties."""
    from transformers import AutoModelForCausalLM

    _, full = read_plan(plans[0.5])
    heads = json.loads((plans[0.5] / "kvplan.json").read_text())["heads"]
    # the plan's 0s first, then its 1s, each part in kvplan's order
    ranked = sorted(heads, key=lambda head: (head["full"], head["score"], head["layer"], head["kv_head"]))
    assert [head["full"] for head in heads] == full.ravel().tolist()
    expected = np.zeros(full.shape, dtype=bool)
    for head in ranked[: round(ratio * full.size)]:
        expected[head["layer"], head["kv_head"]] = True
    press = planned_press(plans[0.5], head_compression_ratio=ratio)
    press.post_init_from_model(AutoModelForCausalLM.from_pretrained(model_folder))
    assert press.streaming_mask.cpu().numpy().tolist() == expected.tolist()
    assert (expected <= ~full).all() if ratio < 0.5 else (expected >= ~full).all()


def test_a_plan_of_another_model_is_refused_in_one_line(model_folder, tmp_path):
    from transformers import AutoModelForCausalLM

    from attnscope.errors import AttnscopeError

    (tmp_path / "full_attention_heads.tsv").write_text("1\t0\n0\t1\n1\t1\n")  # 3 layers; the model has 2
    (tmp_path / "config.json").write_text(json.dumps({"sink_size": SINK, "recent_size": RECENT, "sparsity": 1 / 3}))
    press = planned_press(tmp_path)
    with pytest.raises(AttnscopeError, match=r"is for 3 layers × 2 KV heads, the model has 2 × 2: a plan of an"):
        press.post_init_from_model(AutoModelForCausalLM.from_pretrained(model_folder))


@generates
def test_the_docs_recipe_answers_with_the_plans_streaming_heads(model_folder, plans, monkeypatch):
    monkeypatch.chdir(plans[0.5].parent)  # the recipe reads plan/
    code = recipe()
    namespace = {"model_name": str(model_folder), "context": CONTEXT, "question": QUESTION}
    exec(compile(code, str(RECIPE_PAGE), "exec"), namespace)
    pipe, press, answer = namespace["pipe"], namespace["press"], namespace["answer"]

    config, full = read_plan(plans[0.5])
    assert press.streaming_mask.cpu().numpy().tolist() == (~full).tolist()
    assert (press.sink_size, press.recent_size) == (SINK, RECENT)
    # what the pipeline prefills and then reads (a model without a chat template: BOS + context; question + "\n")
    tokenizer = pipe.tokenizer
    context_ids = tokenizer.encode(tokenizer.bos_token + CONTEXT, add_special_tokens=False)
    question_ids = tokenizer.encode(QUESTION + "\n", add_special_tokens=False)
    assert len(context_ids) > SINK + RECENT + 40
    assert masked_keys(pipe.model) == expected_masked_keys(full, len(context_ids))
    streaming_share = float((~full).mean())
    assert streaming_share == config["sparsity"] == 0.5
    assert press.compression_ratio == pytest.approx(streaming_share * (1 - (SINK + RECENT) / len(context_ids)))

    # the answer is the one a DuoAttention cache of the plan gives, and not full attention's
    reference = reference_model(model_folder, plans[0.5], len(context_ids))
    ids = torch.tensor([context_ids + question_ids])
    tokens, _ = greedy(reference, ids, tokenizer, new_tokens=50)  # the pipeline's default
    assert answer == tokenizer.decode(tokens, skip_special_tokens=True)
    assert answer.strip()
    assert pipe(CONTEXT, question=QUESTION)["answer"] != answer


@generates
def test_generate_under_the_press_is_the_plans_streaming_cache(model_folder, plans):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    model = AutoModelForCausalLM.from_pretrained(model_folder)
    ids = tokenizer(CONTEXT, return_tensors="pt").input_ids  # (1, n)
    press = planned_press(plans[0.5])
    with press(model):
        tokens, logits = greedy(model, ids, tokenizer, NEW_TOKENS)
    _, full = read_plan(plans[0.5])
    assert masked_keys(model) == expected_masked_keys(full, ids.shape[1])

    assert tokens.shape == (NEW_TOKENS,) and 0 <= int(tokens.min()) and int(tokens.max()) < len(tokenizer)
    reference = reference_model(model_folder, plans[0.5], ids.shape[1])
    reference_tokens, reference_logits = greedy(reference, ids, tokenizer, NEW_TOKENS)
    assert tokens.tolist() == reference_tokens.tolist()
    torch.testing.assert_close(logits, reference_logits, atol=1e-4, rtol=1e-4)

    _, plain_logits = greedy(model, ids, tokenizer, NEW_TOKENS)
    torch.testing.assert_close(logits[0], plain_logits[0], atol=1e-4, rtol=1e-4)  # the prefill: full attention
    assert (logits[1:] - plain_logits[1:]).abs().amax() > 0.5  # after it, the streaming heads lost the middle


@generates
def test_a_plan_that_keeps_every_head_full_generates_as_without_a_press(model_folder, plans, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config, full = read_plan(plans[0.0])
    assert full.all() and config["sparsity"] == 0
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    model = AutoModelForCausalLM.from_pretrained(model_folder)
    ids = tokenizer(CONTEXT, return_tensors="pt").input_ids  # (1, n)
    with planned_press(plans[0.0])(model):
        tokens, logits = greedy(model, ids, tokenizer, NEW_TOKENS)
    assert masked_keys(model) == [set(), set()]
    plain_tokens, plain_logits = greedy(model, ids, tokenizer, NEW_TOKENS)
    assert tokens.tolist() == plain_tokens.tolist()
    torch.testing.assert_close(logits, plain_logits, atol=1e-4, rtol=1e-4)

    monkeypatch.chdir(plans[0.0].parent)
    namespace = {"model_name": str(model_folder), "context": CONTEXT, "question": QUESTION}
    exec(compile(recipe(), str(RECIPE_PAGE), "exec"), namespace)
    assert masked_keys(namespace["pipe"].model) == [set(), set()]
    assert namespace["answer"] == namespace["pipe"](CONTEXT, question=QUESTION)["answer"]


def test_a_duoattention_folder_streams_its_lowest_gates_at_the_share_asked_for(model_folder, tmp_path):
    """DuoAttention's own plans: trained gates in [0, 1], config.json's `"sparsity": null`, no kvplan.json."""
    from transformers import AutoModelForCausalLM

    from attnscope.errors import AttnscopeError

    (tmp_path / "full_attention_heads.tsv").write_text("0.9\t0.2\n0.05\t0.7\n")
    (tmp_path / "config.json").write_text(json.dumps({"sink_size": SINK, "recent_size": RECENT, "sparsity": None}))
    with pytest.raises(AttnscopeError, match=r"config.json gives no sparsity: pass head_compression_ratio=$"):
        planned_press(tmp_path)
    with pytest.raises(AttnscopeError, match=r"^head_compression_ratio 1.5 is not a share between 0 and 1$"):
        planned_press(tmp_path, head_compression_ratio=1.5)
    press = planned_press(tmp_path, head_compression_ratio=0.5)
    press.post_init_from_model(AutoModelForCausalLM.from_pretrained(model_folder))
    assert press.streaming_mask.cpu().numpy().tolist() == [[False, True], [True, False]]
