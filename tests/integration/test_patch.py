"""`patch` against patching done by hand: a fresh transformers GPT-2 (eager attention, never touched by attnscope)
whose heads' outputs are recorded and replaced, one head at a time, by forward pre-hooks on `c_proj` written here,
its logit differences read at the last position; on the demo model, whose previous-token head (0.2) and induction
heads (1.0, 1.2, 1.3) are known, the shares fall where induction says they must; what a pair cannot be is refused in
one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import attnscope
from attnscope.errors import AttnscopeError
from attnscope.pipeline import interventions
from attnscope.pipeline.prompt_pairs import continuation

# Two lengths (15 and 13 tokens with BOS), two pairs of one length (a batch of two), and one pair whose corruption
# moves the logit difference the other way: the tiny model's differences are 1.58, 0.13 and -0.08.
PAIRS = [
    {
        "clean": "When Mary and John went to the store, John gave a drink to",
        "corrupt": "When Mary and John went to the store, John gave a drink from",
        "answer": " Mary",
        "wrong": " John",
    },
    {
        "clean": "Alice gave Bob a book, and then Bob gave it to",
        "corrupt": "Alice gave Bob a book, and then Alice gave it to",
        "answer": " Alice",
        "wrong": " Bob",
    },
    {
        "clean": "The cat sat on the mat and the dog sat on the",
        "corrupt": "The cat sat on the rug and the dog sat on the",
        "answer": " mat",
        "wrong": " rug",
    },
]


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    return attnscope.load(tiny_model_dir, "cpu", lm_head=True)


@pytest.fixture(scope="module")
def demo():
    return attnscope.load("demo", "cpu", lm_head=True)


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    path.write_text("".join(json.dumps(pair) + "\n" for pair in PAIRS), encoding="utf-8")
    return path


def _by_hand(folder, pairs):
    """(clean, corrupt) logit differences (P,) and the denoised and noised ones (P, L, H), each head patched alone
    at every position by a pre-hook on its layer's c_proj, in a fresh eager GPT2LMHeadModel."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    L, H = model.config.n_layer, model.config.n_head
    d_head = model.config.n_embd // H

    def run(ids, answer, wrong, patch=None):
        """The logit difference of one prompt, and what each c_proj received; `patch` = (layer, head, inputs)."""
        received, handles = {}, []
        for layer, block in enumerate(model.transformer.h):

            def hook(module, args, layer=layer):
                received[layer] = args[0].clone()
                if patch is not None and patch[0] == layer:
                    x = args[0].clone()
                    columns = slice(patch[1] * d_head, (patch[1] + 1) * d_head)
                    x[..., columns] = patch[2][layer][..., columns]
                    return (x,)
                return None

            handles.append(block.attn.c_proj.register_forward_pre_hook(hook))
        try:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        finally:
            for handle in handles:
                handle.remove()
        return float(logits[answer] - logits[wrong]), received

    clean_ld, corrupt_ld = np.zeros(len(pairs)), np.zeros(len(pairs))
    denoised, noised = np.zeros((len(pairs), L, H)), np.zeros((len(pairs), L, H))
    for p, pair in enumerate(pairs):
        clean, corrupt = ([tokenizer.bos_token_id] + tokenizer(pair[key])["input_ids"] for key in ("clean", "corrupt"))
        (answer,), (wrong,) = tokenizer(pair["answer"])["input_ids"], tokenizer(pair["wrong"])["input_ids"]
        clean_ld[p], clean_inputs = run(clean, answer, wrong)
        corrupt_ld[p], corrupt_inputs = run(corrupt, answer, wrong)
        for layer in range(L):
            for head in range(H):
                denoised[p, layer, head] = run(corrupt, answer, wrong, (layer, head, clean_inputs))[0]
                noised[p, layer, head] = run(clean, answer, wrong, (layer, head, corrupt_inputs))[0]
    return clean_ld, corrupt_ld, denoised, noised


@pytest.fixture(scope="module")
def by_hand(tiny_model_dir):
    return _by_hand(tiny_model_dir, PAIRS)


@pytest.mark.parametrize("copies", ["all heads in one pass", "one head per pass"])
def test_the_shares_are_those_of_patching_each_head_by_hand(lm, pairs_file, by_hand, copies, monkeypatch):
    """Every pair's baselines and patched logit differences, and the shares as ratios of sums over the pairs, equal
    those of hooks written here; whether the heads' copies share a forward pass or not."""
    if copies == "one head per pass":
        monkeypatch.setattr(interventions, "MAX_COPY_TOKENS", 1)
    result = attnscope.patch(lm, file=pairs_file)
    clean_ld, corrupt_ld, denoised, noised = by_hand
    assert [pair["clean_logit_diff"] for pair in result.pairs] == pytest.approx(clean_ld, abs=1e-5)
    assert [pair["corrupt_logit_diff"] for pair in result.pairs] == pytest.approx(corrupt_ld, abs=1e-5)
    np.testing.assert_allclose(result.denoised, denoised, atol=1e-5)
    np.testing.assert_allclose(result.noised, noised, atol=1e-5)
    difference = (clean_ld - corrupt_ld).sum()
    np.testing.assert_allclose(result.restored, (denoised - corrupt_ld[:, None, None]).sum(0) / difference, atol=1e-5)
    np.testing.assert_allclose(result.removed, (clean_ld[:, None, None] - noised).sum(0) / difference, atol=1e-5)
    assert result.clean_logit_diff == pytest.approx(clean_ld.mean(), abs=1e-5)
    assert [pair["answer"] for pair in result.pairs] == [" Mary", " Alice", " mat"]
    assert [pair["n_tokens"] for pair in result.pairs] == [15, 13, 13]
    assert [pair["source"] for pair in result.pairs] == [f"{pairs_file}:{line}" for line in (1, 2, 3)]
    assert any(f"{pairs_file}:3" in note and "the other way" in note for note in result.notes)  # its gap is < 0


FAMILY_CLEAN = "the cat sat on the mat and the cat sat on the"  # words of the family models' tokenizers


@pytest.mark.slow  # seconds: the families' tokenizers are trained when first built
@pytest.mark.parametrize("family", ["llama", "gemma2", "qwen2"])
def test_other_families_patched_with_the_layers_below_skipped_equal_patching_by_hand(family_dir, family):
    """Rotary positions and grouped-query attention (Llama), soft-capping, sliding windows and norms around the
    attention (Gemma 2), no BOS (Qwen 2): the patched runs, which skip the layers below the patched head's, give the
    logit differences of full forward passes of a fresh model patched by hand on `self_attn.o_proj`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = family_dir(family)
    pair = {"clean": FAMILY_CLEAN, "corrupt": FAMILY_CLEAN.replace("cat", "dog"), "answer": "mat", "wrong": "dog"}
    result = attnscope.patch(folder, device="cpu", **pair)
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    ids = {key: bos + tokenizer(pair[key], add_special_tokens=False)["input_ids"] for key in ("clean", "corrupt")}
    answer, wrong = result.pairs[0]["answer_id"], result.pairs[0]["wrong_id"]
    projections = [layer.self_attn.o_proj for layer in model.model.layers]
    H = model.config.num_attention_heads
    d_head = projections[0].in_features // H

    def run(key, patch=None):
        received, handles = {}, []
        for layer, projection in enumerate(projections):

            def hook(module, args, layer=layer):
                received[layer] = args[0].clone()
                if patch is not None and patch[0] == layer:
                    x = args[0].clone()
                    x[..., patch[1] * d_head : (patch[1] + 1) * d_head] = patch[2][layer][
                        ..., patch[1] * d_head : (patch[1] + 1) * d_head
                    ]
                    return (x,)
                return None

            handles.append(projection.register_forward_pre_hook(hook))
        try:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids[key]])).logits[0, -1]
        finally:
            for handle in handles:
                handle.remove()
        return float(logits[answer] - logits[wrong]), received

    clean, clean_inputs = run("clean")
    corrupt, corrupt_inputs = run("corrupt")
    assert result.pairs[0]["clean_logit_diff"] == pytest.approx(clean, abs=1e-4)
    for layer in range(len(projections)):
        for head in range(H):
            assert result.denoised[0, layer, head] == pytest.approx(
                run("corrupt", (layer, head, clean_inputs))[0], abs=1e-4
            )
            assert result.noised[0, layer, head] == pytest.approx(
                run("clean", (layer, head, corrupt_inputs))[0], abs=1e-4
            )


def test_the_hook_replaces_what_it_is_told_per_copy_head_and_position_and_nothing_else(lm):
    """PatchedHeads: two copies of a batch, copy 1 with head 1.2 replaced at position 3 alone, equal a hand hook
    on the same forward; a layer with nothing chosen runs as it was."""
    ids = torch.arange(5, 13)[None]  # (1, 8)
    H, d_head = lm.n_head, lm.d_head
    values = torch.randn(1, 8, H, d_head)  # (B, n, H, d_head)
    patches = interventions.PatchedHeads()
    chosen = torch.zeros(2, 1, 8, H, dtype=torch.bool)  # (C, B, n, H)
    chosen[1, 0, 3, 2] = True
    with torch.no_grad():
        plain = lm.model(input_ids=ids).last_hidden_state  # (1, 8, d)
        with interventions.hooks(lm, patches):
            patches.chosen, patches.values = {1: chosen}, {1: values}
            both = lm.model(input_ids=ids.repeat(2, 1)).last_hidden_state  # (2, 8, d)

        def by_hand(module, args):
            x = args[0].clone()
            x[0, 3, 2 * d_head : 3 * d_head] = values[0, 3, 2]
            return (x,)

        handle = lm.family.output_projections(lm.model)[1].register_forward_pre_hook(by_hand)
        try:
            expected = lm.model(input_ids=ids).last_hidden_state
        finally:
            handle.remove()
    torch.testing.assert_close(both[0], plain[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(both[1], expected[0], rtol=0, atol=1e-5)
    assert not torch.allclose(expected, plain, atol=1e-3)  # the replacement did something


# ------------------------------------------------------------------------------------------- the demo's known heads

REPEATED = "The file and the list hold the value {0}. The file and the list hold the value"


def test_on_the_demo_the_induction_heads_restore_what_the_first_copy_says(demo):
    """Clean: the first copy says `value method`, so the second predicts ` method` by induction; corrupted: it says
    `value table`. What differs reaches the last position through the induction heads 1.0, 1.2 and 1.3, which
    restore (and remove) most of the difference; layer 0, which cannot see the first copy's token from the last
    position except through them, little."""
    result = attnscope.patch(
        demo, clean=REPEATED.format("method"), corrupt=REPEATED.format("table"), answer="method", wrong="table"
    )
    assert result.clean_logit_diff > 5 and result.corrupt_logit_diff < -5  # the model does induction here
    induction = [(1, 0), (1, 2), (1, 3)]
    assert sum(result.restored[lh] for lh in induction) > 0.8
    assert sum(result.removed[lh] for lh in induction) > 0.8
    assert np.abs(result.restored[0]).max() < 0.1 and np.abs(result.removed[0]).max() < 0.1
    assert set(result.ranked_labels()[:2]) == {"1.0", "1.3"}


def test_on_the_demo_the_previous_token_head_restores_which_token_came_before(demo):
    """Corrupt the token before the first ` method` (`value` → `code`): the induction heads find ` method` by the
    previous-token head 0.2's output at its position, which now says `code`; patching 0.2 alone restores most of
    the difference, and the other heads of layer 0 little."""
    result = attnscope.patch(
        demo,
        clean=REPEATED.format("method"),
        corrupt=REPEATED.format("method").replace("the value method", "the code method"),
        answer="method",
        wrong="table",
    )
    assert result.restored[0, 2] > 0.5 and result.removed[0, 2] > 0.5
    assert max(abs(result.restored[0, head]) for head in (0, 1, 3)) < 0.1
    assert result.ranked_labels()[0] == "0.2"


# ------------------------------------------------------------------------------------------------------- refused


def test_the_answer_is_the_next_word_with_or_without_its_space():
    assert continuation("gave a drink to", "Mary") == " Mary"
    assert continuation("gave a drink to", " Mary") == " Mary"
    assert continuation("gave a drink to ", "Mary") == "Mary"  # the prompt ends in a space already
    assert continuation("the end", ".") == "." and continuation("John", "'s") == "'s"


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"corrupt": "When Mary and John went to the big store, John gave a drink to"},
            "the clean prompt is 15 tokens",
        ),
        ({"answer": "Maryanne-Louise"}, "answer 'Maryanne-Louise' is not one token after the prompt"),
        ({"wrong": " Mary"}, "answer and wrong are the same token ' Mary'"),
        ({"corrupt": PAIRS[0]["clean"]}, "the clean and corrupted prompts give the same logit difference"),
    ],
)
def test_a_pair_that_cannot_be_patched_is_refused_in_one_line(lm, change, message):
    with pytest.raises(AttnscopeError) as raised:
        attnscope.patch(lm, **(PAIRS[0] | change))
    assert str(raised.value).startswith(("the pair given: " + message, message)) and "\n" not in str(raised.value)


def test_an_encoder_is_refused_before_its_weights_load(tiny_bert_dir):
    with pytest.raises(AttnscopeError, match="it needs a decoder .* this model is an encoder$"):
        attnscope.patch(tiny_bert_dir, **PAIRS[0])


def test_the_notebook_shades_the_shares_from_blue_through_white_to_red_and_escapes_the_tokens():
    """A share of 1 is the scale's full red, −1 its full blue, 0 white; a token holding markup is shown as text."""
    import html as escaping

    from attnscope.analyses.patch import PatchResult
    from attnscope.output.notebook import html
    from attnscope.output.views import view_of

    hostile = "<script>alert('x')</script> & co"

    model = {"name": "tiny", "kind": "decoder", "n_layer": 1, "n_head": 3}
    pair = {"index": 0, "source": "the pair given", "answer": hostile, "wrong": " b"}
    shares = np.array([[1.0, -1.0, 0.0]])
    result = PatchResult(
        model, {"n_pairs": 1}, {"top": None}, [pair], 2.0, 1.0, shares, shares, np.zeros(1), np.zeros(1), [hostile]
    )
    fragment = html(view_of(result))
    assert "<script" not in fragment.lower() and escaping.escape(hostile, quote=True) in fragment
    assert "background:rgb(178,24,43)" in fragment and "background:rgb(33,102,172)" in fragment
    assert "background:rgb(247,247,247)" in fragment
    assert "Share of the logit difference restored (1 = all of it)" in fragment


@pytest.mark.slow
def test_the_ioi_pairs_of_the_docs_are_ioi_pairs_every_one_read(lm):
    """sample_texts/ioi-pairs.jsonl, the docs' GPT-2 example: each pair is Wang et al.'s IOI sentence with its second
    mention of the subject replaced by the indirect object (symmetric token replacement, Heimersheim & Nanda 2024),
    answer the indirect object, wrong the subject; with the GPT-2 tokenizer every pair reads, as many tokens in both
    prompts, one token each for answer and wrong."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "sample_texts" / "ioi-pairs.jsonl"
    pairs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(pairs) == 16
    for pair in pairs:
        clean, corrupt = pair["clean"].split(), pair["corrupt"].split()
        changed = [k for k, (a, b) in enumerate(zip(clean, corrupt, strict=True)) if a != b]
        assert len(changed) == 1 and clean[changed[0]] == pair["wrong"] and corrupt[changed[0]] == pair["answer"]
        assert pair["answer"] in clean[: changed[0]] and pair["wrong"] in clean[: changed[0]]  # both named before
    result = attnscope.patch(lm, file=str(path))
    document = json.loads(result.to_json())
    assert len(document["pairs"]) == 16


@pytest.mark.slow
def test_special_tokens_written_in_the_prompts_get_a_note(lm):
    """`<|endoftext|>` written in a prompt is read as GPT-2's BOS, mid-prompt: said, as heads and kvplan say it of
    texts (issue 38); prompts without one get no such note."""
    special = attnscope.patch(
        lm, clean="When Mary and John went to the store,<|endoftext|> John gave a drink to", answer=" Mary",
        corrupt="When Mary and John went to the store,<|endoftext|> Mary gave a drink to", wrong=" John",
    )  # fmt: skip
    (note,) = [note for note in special.notes if "special token" in note]
    assert note.startswith("the prompts write 2 special tokens of the tokenizer (<|endoftext|> × 2 (id 50256, the BOS)")
    plain = attnscope.patch(lm, **{key: PAIRS[1][key] for key in ("clean", "corrupt", "answer", "wrong")})
    assert not any("special token" in note for note in plain.notes)
