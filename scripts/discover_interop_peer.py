"""auto-circuit's edge attribution patching (EAP) of a Hugging Face GPT-2 folder, written as attnscope's JSON names
its edges: the peer's side of tests/integration/test_discover_interop.py, run by scripts/discover_interop.sh with the
peer's own Python (auto-circuit 1.0.1 on TransformerLens 2.18 and transformers 4.57; attnscope needs transformers 5).

    python scripts/discover_interop_peer.py MODEL_DIR PAIRS.jsonl OUT.json

The model: the folder's GPT2LMHeadModel, its weights converted by TransformerLens (`convert_gpt2_weights`,
transformer_lens/pretrained/weight_conversions/gpt2.py) into a HookedTransformer configured as TransformerLens
configures GPT-2 (`convert_hf_model_config`'s GPT2LMHeadModel branch, loading_from_pretrained.py; written here because
`from_pretrained_no_processing` takes official model names only), loaded with no processing at all: no LayerNorm
folding, no centring, no value-bias folding. auto-circuit's hooks are switched on as its `load_tl_model`
does (experiment_utils.py): each head's output apart (hook_result: z W_O without b_O, a constant across runs), each
head's q, k, v inputs apart, the MLP's input before its LayerNorm.

The pairs (attnscope's pairs.jsonl: clean, corrupt, answer, wrong): each prompt after `<|endoftext|>` (`to_tokens`,
prepend_bos=True), answer and wrong one token each; every pair in one batch, since auto-circuit's metric
(`batch_avg_answer_diff`, utils/tensor_ops.py) is the batch's mean logit difference.

Two of auto-circuit's scorers, on the factorized graph with separate q, k, v inputs, the logits read at the last
position (`slice_output="last_seq"`):
    eap            `edge_attribution_patching_prune_scores` (prune_algos/edge_attribution_patching.py): Σ over the
                   batch and the positions of ∂loss/∂r_v · (corrupt − clean), loss = −mean LD
    mask_gradient  `mask_gradient_prune_scores` (prune_algos/mask_gradient.py) with grad_function="logit",
                   answer_function="avg_diff", mask_val=0 and resample ablation from the corrupted prompts: ∂loss/∂m
                   of the edge's mask m, which moves the edge from its clean value (0) to its corrupted one (1)
Both are mean_pairs Σ_positions (clean − corrupt) · ∂LD/∂r_v: attnscope's `eap`, sign included (the two minus signs
cancel). Each is timed as the test times attnscope: on one thread, the fastest of 10 calls after 3 s of calls to
warm up.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time

import torch
import transformer_lens as tl
from auto_circuit.data import PromptDataLoader, PromptDataset
from auto_circuit.prune_algos.edge_attribution_patching import edge_attribution_patching_prune_scores
from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores
from auto_circuit.types import AblationType
from auto_circuit.utils.graph_utils import patchable_model
from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights
from transformers import AutoTokenizer, GPT2LMHeadModel

WARM_S, REPEATS = 3.0, 10


def hooked_gpt2(folder: str) -> tl.HookedTransformer:
    """The folder's GPT-2 as a HookedTransformer with its weights as they are, auto-circuit's hooks on."""
    hf_model = GPT2LMHeadModel.from_pretrained(folder).eval()
    hf = hf_model.config
    assert hf.activation_function == "gelu_new" and hf.scale_attn_weights and not hf.scale_attn_by_inverse_layer_idx
    config = tl.HookedTransformerConfig(
        d_model=hf.n_embd, d_head=hf.n_embd // hf.n_head, n_heads=hf.n_head, d_mlp=hf.n_inner or 4 * hf.n_embd,
        n_layers=hf.n_layer, n_ctx=hf.n_positions, eps=hf.layer_norm_epsilon, d_vocab=hf.vocab_size,
        act_fn=hf.activation_function, use_attn_scale=True, normalization_type="LN",
        original_architecture="GPT2LMHeadModel", default_prepend_bos=True,
        use_attn_result=True, use_split_qkv_input=True, use_hook_mlp_in=True,
    )  # fmt: skip
    model = tl.HookedTransformer(config, tokenizer=AutoTokenizer.from_pretrained(folder))
    model.load_and_process_state_dict(
        convert_gpt2_weights(hf_model, config), fold_ln=False, center_writing_weights=False, center_unembed=False,
        fold_value_biases=False, refactor_factored_attn_matrices=False,
    )  # fmt: skip
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad = False
    return model


def read_pairs(model: tl.HookedTransformer, path: str) -> tuple[PromptDataLoader, list[dict]]:
    """One batch of every pair in the file, and each pair as this side read it: its tokens and its LDs."""
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    clean = tokens(model, [row["clean"] for row in rows])  # (P, n)
    corrupt = tokens(model, [row["corrupt"] for row in rows])  # (P, n)
    answer = torch.tensor([model.to_single_token(" " + row["answer"].lstrip(" ")) for row in rows])  # (P,)
    wrong = torch.tensor([model.to_single_token(" " + row["wrong"].lstrip(" ")) for row in rows])  # (P,)
    loader = PromptDataLoader(
        PromptDataset(clean, corrupt, list(answer[:, None]), list(wrong[:, None])), seq_len=None, diverge_idx=0,
        batch_size=len(rows), shuffle=False,
    )  # fmt: skip
    clean_ld, corrupt_ld = (logit_differences(model, ids, answer, wrong) for ids in (clean, corrupt))
    records = [
        {"clean": clean[k].tolist(), "corrupt": corrupt[k].tolist(), "answer_id": int(answer[k]),
         "wrong_id": int(wrong[k]), "clean_logit_diff": float(clean_ld[k]), "corrupt_logit_diff": float(corrupt_ld[k])}
        for k in range(len(rows))
    ]  # fmt: skip
    return loader, records


def tokens(model: tl.HookedTransformer, texts: list[str]) -> torch.Tensor:
    """(P, n) each text after `<|endoftext|>`, refused unless all have as many tokens (one batch, no padding)."""
    ids = [model.to_tokens(text, prepend_bos=True)[0] for text in texts]  # P × (n,)
    assert len({len(row) for row in ids}) == 1, "every prompt must have as many tokens (one batch)"
    return torch.stack(ids)


def logit_differences(model: tl.HookedTransformer, ids: torch.Tensor, answer: torch.Tensor, wrong: torch.Tensor):
    """(P,) LD = logit(answer) − logit(wrong) at the last position."""
    with torch.no_grad():
        logits = model(ids)[:, -1]  # (P, V)
    rows = torch.arange(len(ids))
    return logits[rows, answer] - logits[rows, wrong]  # (P,)


def attnscope_name(edge) -> dict:
    """An auto-circuit edge (`A1.2->A1.3.K`, `MLP 0->Resid End`, …) as attnscope's JSON names it."""
    source = edge.src.name
    upstream = "embed" if source == "Resid Start" else source.lower() if source.startswith("MLP") else source[1:]
    target = edge.dest.name
    if target == "Resid End":
        return {"from": upstream, "to": "logits", "input": None}
    if target.startswith("MLP"):
        return {"from": upstream, "to": target.lower(), "input": None}
    head, letter = target[1:].rsplit(".", 1)
    return {"from": upstream, "to": head, "input": letter.lower()}


def timed(score) -> tuple[dict, float]:
    """The scorer's prune scores and the fastest of REPEATS calls, after calls for WARM_S seconds."""
    start = time.perf_counter()
    while time.perf_counter() - start < WARM_S:
        score()
    seconds = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        scores = score()
        seconds.append(time.perf_counter() - start)
    return scores, min(seconds)


def scorers(patchable, loader: PromptDataLoader) -> dict:
    """auto-circuit's two EAP scorers, each a call that gives its prune scores."""
    return {
        "eap": lambda: edge_attribution_patching_prune_scores(patchable, loader, None),
        "mask_gradient": lambda: mask_gradient_prune_scores(
            patchable, loader, None, grad_function="logit", answer_function="avg_diff", mask_val=0.0,
            ablation_type=AblationType.RESAMPLE, clean_corrupt="corrupt",
        ),
    }  # fmt: skip


def main(folder: str, pairs: str, out: str) -> None:
    torch.set_num_threads(1)  # as the test times attnscope
    model = hooked_gpt2(folder)
    loader, records = read_pairs(model, pairs)
    patchable = patchable_model(model, factorized=True, slice_output="last_seq", separate_qkv=True)
    methods = {}
    for name, score in scorers(patchable, loader).items():
        scores, seconds = timed(score)
        edges = [{**attnscope_name(edge), "score": float(edge.prune_score(scores))} for edge in patchable.edges]
        methods[name] = {"seconds": seconds, "edges": edges}
    packages = ("auto-circuit", "transformer-lens", "transformers", "torch")
    versions = {name: importlib.metadata.version(name) for name in packages}
    result = {"versions": versions, "pairs": records, "methods": methods}
    with open(out, "w", encoding="utf-8") as file:
        json.dump(result, file, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
