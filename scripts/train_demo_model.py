#!/usr/bin/env python
"""Train the tiny GPT-2 demo model that ships with attnscope.

The model is a toy: a 4-layer, 4-head GPT-2 (transformers' own ``GPT2LMHeadModel``)
trained for a few thousand steps on one CPU core.  Its only purpose is to give
attnscope something small, offline and licence-clean to analyse, with real,
learned attention heads of two well known kinds:

* previous-token heads (query i attends to key i-1), and
* induction heads (in ``... A B ... A`` the second ``A`` attends to the ``B``
  that followed the first ``A``).

Corpus: the English documentation text that ships inside CPython itself,
``pydoc_data.topics.topics`` plus the docstrings of a fixed list of standard
library modules (Python Software Foundation License).  Nothing is downloaded.

To make induction heads form, part of the training samples are made
predictable by copying: some are random ordinary words repeated with a fixed
period (``[BOS] x1..xT x1..xT x1..``), others contain a repeated span (random
tokens or a span of the sample's own text copied further on).  The rest is
plain text.

After training, the script saves the model (config.json + model.safetensors)
and a byte-level BPE tokenizer into ``--out-dir``, reloads the folder the way
attnscope does (``AutoModel`` with eager attention, ``AutoTokenizer``),
measures per-head previous-token and induction scores with
``output_attentions=True``, writes MODEL_CARD.md, and exits non-zero if the
targets are not met.

Usage (the command used for the shipped model is recorded in MODEL_CARD.md):

    nice -n 10 python scripts/train_demo_model.py
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import logging
import os
import random
import re
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
BOS = "<|endoftext|>"

# Standard-library modules whose docstrings are added to the corpus.  A fixed
# list (rather than walking sys.stdlib_module_names) keeps the corpus
# deterministic and avoids importing modules with side effects (this, antigravity).
DOC_MODULES = [
    "abc", "argparse", "array", "ast", "asyncio", "base64", "bisect", "builtins",
    "bz2", "calendar", "cmd", "codecs", "collections", "colorsys", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib",
    "dis", "doctest", "email", "email.message", "enum", "filecmp", "fnmatch",
    "fractions", "ftplib", "functools", "getopt", "gettext", "glob", "gzip",
    "hashlib", "heapq", "hmac", "html", "html.parser", "http.client",
    "http.server", "imaplib", "importlib", "inspect", "io", "ipaddress",
    "itertools", "json", "locale", "logging", "lzma", "mailbox", "math",
    "mimetypes", "operator", "optparse", "os", "pathlib", "pdb", "pickle",
    "pkgutil", "platform", "poplib", "pprint", "pydoc", "queue", "random", "re",
    "sched", "secrets", "selectors", "shelve", "shlex", "shutil", "signal",
    "smtplib", "socket", "sqlite3", "statistics", "string", "struct",
    "subprocess", "sys", "sysconfig", "tarfile", "tempfile", "textwrap",
    "threading", "time", "timeit", "tokenize", "trace", "traceback", "types",
    "typing", "unicodedata", "unittest", "urllib.parse", "urllib.request",
    "uuid", "warnings", "wave", "weakref", "xml.dom.minidom",
    "xml.etree.ElementTree", "zipfile", "zipimport", "zlib",
]

# Ordinary English sentences used to measure previous-token heads.
PREV_TOKEN_SENTENCES = [
    "The cat sat on the mat because it was tired.",
    "When the doctor arrived, the patient was already asleep in the small room.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "She opened the window and looked at the garden for a long time.",
    "Every morning the old man walked to the market to buy fresh bread.",
    "If the value is not found, the function returns an empty list instead.",
]

log = logging.getLogger("train_demo_model")


# --------------------------------------------------------------------------- #
# Arguments, seeds, logging
# --------------------------------------------------------------------------- #
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out-dir", type=Path, default=REPO_ROOT / "attnscope" / "demo_model",
                   help="folder to write the model, tokenizer and model card into")
    p.add_argument("--log-file", type=Path, default=None,
                   help="progress log (default: <out-dir>/train.log)")
    p.add_argument("--seed", type=int, default=1234)
    # tokenizer
    p.add_argument("--vocab-size", type=int, default=4096)
    # architecture
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--n-positions", type=int, default=256)
    # training
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128, help="training sequence length")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--periodic-prob", type=float, default=0.7,
                   help="probability that a training sample is random ordinary words "
                        "repeated with a period of --min-period..--max-period tokens")
    p.add_argument("--min-period", type=int, default=4)
    p.add_argument("--start-period", type=int, default=12, help="largest period at step 0 (curriculum)")
    p.add_argument("--max-period", type=int, default=60, help="largest period once the curriculum ends")
    p.add_argument("--curriculum", type=float, default=0.5, help="fraction of steps over which periods grow")
    p.add_argument("--repeat-prob", type=float, default=0.1,
                   help="probability that a training sample contains a repeated span")
    p.add_argument("--random-repeat-frac", type=float, default=0.5,
                   help="of the repeated spans, the fraction made of random tokens "
                        "(the rest copy a span of the sample's own text)")
    p.add_argument("--min-span", type=int, default=8)
    p.add_argument("--max-span", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    # measurement targets
    p.add_argument("--induction-period", type=int, default=50)
    p.add_argument("--prev-target", type=float, default=0.7)
    p.add_argument("--induction-target", type=float, default=0.5)
    return p.parse_args(argv)


def set_seeds(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def setup_logging(log_file: Path) -> None:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S")
    log.setLevel(logging.INFO)
    for h in (logging.StreamHandler(sys.stdout), logging.FileHandler(log_file, mode="w")):
        h.setFormatter(fmt)
        log.addHandler(h)


# --------------------------------------------------------------------------- #
# Corpus and tokenizer
# --------------------------------------------------------------------------- #
def _clean(text: str) -> str:
    text = inspect.cleandoc(text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def build_corpus() -> list[str]:
    """Return a deterministic list of English documents from CPython's own docs."""
    from pydoc_data.topics import topics  # dict[str, str], PSF licence

    docs = [_clean(topics[k]) for k in sorted(topics)]
    seen: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in DOC_MODULES:
            try:
                mod = importlib.import_module(name)
            except Exception:  # optional C modules may be missing
                continue
            objs = [mod]
            for attr in sorted(vars(mod)):
                obj = getattr(mod, attr, None)
                if getattr(obj, "__module__", None) != mod.__name__:
                    continue
                objs.append(obj)
                if inspect.isclass(obj):
                    objs.extend(getattr(obj, a, None) for a in sorted(vars(obj)))
            for obj in objs:
                doc = getattr(obj, "__doc__", None)
                if isinstance(doc, str) and len(doc) >= 80 and doc not in seen:
                    seen.add(doc)
                    docs.append(_clean(doc))
    return docs


def train_tokenizer(docs: list[str], vocab_size: int, max_len: int):
    """Byte-level BPE (GPT-2 style) trained on the corpus, wrapped as GPT2TokenizerFast."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(docs, vocab_size=vocab_size, min_frequency=2,
                            special_tokens=[BOS], show_progress=False)
    tok = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=BOS, eos_token=BOS,
                            unk_token=BOS, model_max_length=max_len)
    assert tok.convert_tokens_to_ids(BOS) == 0
    return tok


def ordinary_word_ids(tok) -> np.ndarray:
    """Ids of vocabulary entries that are a space followed by a lowercase word (>=3 letters)."""
    ids = [i for tkn, i in tok.get_vocab().items() if re.fullmatch(r"Ġ[a-z]{3,}", tkn)]
    return np.array(sorted(ids), dtype=np.int64)


# --------------------------------------------------------------------------- #
# Training data
# --------------------------------------------------------------------------- #
class Sampler:
    """Draws training batches: [BOS] + a window of the token stream, sometimes with a repeat."""

    def __init__(self, stream: np.ndarray, bos_id: int, vocab_size: int, word_ids: np.ndarray,
                 args, rng):
        self.stream = stream          # (N,) int64, documents joined by BOS
        self.word_ids = word_ids      # (W,) ids of ordinary words, for periodic samples
        self.bos_id = bos_id
        self.vocab_size = vocab_size
        self.args = args
        self.rng = rng
        self.max_period = args.max_period  # the training loop raises it step by step (a curriculum)

    def sample(self) -> tuple[np.ndarray, np.ndarray]:
        a, rng, S = self.args, self.rng, self.args.seq_len
        off = rng.integers(0, len(self.stream) - S)
        ids = np.concatenate([[self.bos_id], self.stream[off:off + S - 1]])   # (S,)
        labels = ids.copy()                                                    # (S,)
        u = rng.random()
        if u < a.periodic_prob:
            # random ordinary words with period T, repeated to the end of the sample
            T = int(rng.integers(a.min_period, self.max_period + 1))
            pattern = rng.choice(self.word_ids, size=T, replace=False)         # (T,)
            ids[1:] = np.resize(pattern, S - 1)                                # (S-1,)
            labels = ids.copy()                                                # (S,)
            labels[1:T + 1] = -100    # the first period cannot be predicted
        elif u < a.periodic_prob + a.repeat_prob:
            L = int(rng.integers(a.min_span, a.max_span + 1))
            n_copies = 2 if 1 + 2 * L > S or rng.random() < 0.7 else 3
            n_copies = min(n_copies, (S - 1) // L)
            start = int(rng.integers(1, S - n_copies * L + 1))
            # gaps between copies: distribute the free room at random
            free = S - start - n_copies * L
            gaps = np.sort(rng.integers(0, free + 1, size=n_copies - 1)) if n_copies > 1 else []
            gaps = np.diff(np.concatenate([[0], gaps]))
            if rng.random() < a.random_repeat_frac:
                span, random_span = rng.integers(1, self.vocab_size, size=L), True  # (L,)
            else:
                span, random_span = ids[start:start + L].copy(), False              # (L,)
            pos = start
            for c in range(n_copies):
                ids[pos:pos + L] = span
                labels[pos:pos + L] = -100 if (c == 0 and random_span) else span
                if c < n_copies - 1:
                    pos += L + int(gaps[c])
        return ids, labels

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [self.sample() for _ in range(self.args.batch_size)]
        ids = torch.from_numpy(np.stack([p[0] for p in pairs]))      # (B, S)
        labels = torch.from_numpy(np.stack([p[1] for p in pairs]))   # (B, S)
        return ids, labels


# --------------------------------------------------------------------------- #
# Head measurements
# --------------------------------------------------------------------------- #
@torch.no_grad()
def attentions(model, ids: torch.Tensor) -> torch.Tensor:
    """Attention probabilities of every head: (n_layer, n_head, S, S) for ids of shape (1, S)."""
    out = model(input_ids=ids, output_attentions=True)
    return torch.stack([a[0] for a in out.attentions])  # (n_layer, n_head, S, S)


def previous_token_scores(model, tok, sentences=PREV_TOKEN_SENTENCES) -> torch.Tensor:
    """Mean over query rows i>=1 of A[i, i-1], averaged over sentences: (n_layer, n_head)."""
    per_sentence = []
    for s in sentences:
        ids = torch.tensor([[tok.bos_token_id] + tok(s).input_ids])      # (1, S)
        A = attentions(model, ids)                                        # (L, H, S, S)
        S = ids.shape[1]
        i = torch.arange(1, S)
        per_sentence.append(A[:, :, i, i - 1].mean(-1))                   # (L, H)
    return torch.stack(per_sentence).mean(0)                              # (L, H)


def induction_scores(model, tok, period: int, n_seqs: int = 5, seed: int = 0) -> torch.Tensor:
    """Attention from query i in the second copy to key i-(T-1), averaged: (n_layer, n_head).

    Sequence: [BOS] + x_1..x_T + x_1..x_T with distinct ordinary-word tokens x.
    """
    words = ordinary_word_ids(tok)
    rng = np.random.default_rng(seed)
    per_seq = []
    for _ in range(n_seqs):
        seq = rng.choice(words, size=period, replace=False)              # (T,)
        ids = torch.tensor([[tok.bos_token_id, *seq, *seq]])             # (1, 2T+1)
        A = attentions(model, ids)                                       # (L, H, 2T+1, 2T+1)
        q = torch.arange(period + 1, 2 * period + 1)                     # second copy
        per_seq.append(A[:, :, q, q - (period - 1)].mean(-1))            # (L, H)
    return torch.stack(per_seq).mean(0)                                  # (L, H)


def best_head(scores: torch.Tensor) -> tuple[str, float]:
    flat = int(scores.argmax())
    layer, head = divmod(flat, scores.shape[1])
    return f"{layer}.{head}", float(scores.max())


def format_scores(name: str, scores: torch.Tensor) -> str:
    lines = [f"{name} (rows = layer, cols = head):"]
    lines.append("       " + " ".join(f"  h{h}  " for h in range(scores.shape[1])))
    for layer, row in enumerate(scores.tolist()):
        lines.append(f"  L{layer}   " + " ".join(f"{v:6.3f}" for v in row))
    return "\n".join(lines)


# --------------------------------------------------------------------------- #
# Model card
# --------------------------------------------------------------------------- #
def write_model_card(path: Path, args, command: str, n_params: int, n_docs: int,
                     n_tokens: int, wall_s: float, prev, ind, folder_bytes: int, ok: bool):
    pb, pv = best_head(prev)
    ib, iv = best_head(ind)
    card = f"""# attnscope demo model

A tiny GPT-2-style transformer trained from scratch **only to demonstrate attnscope**.
It is a toy: it is not a useful language model and should not be used to generate
or judge text. What it does have are real, learned attention heads of two known
kinds (nothing was planted by hand), so the tool has something to find:

| head kind | best head (`layer.head`, 0-based) | score | target |
|---|---|---|---|
| previous-token | {pb} | {pv:.3f} | >= {args.prev_target} |
| induction | {ib} | {iv:.3f} | >= {args.induction_target} |

Targets {"met" if ok else "NOT met"}.

## Model

- Architecture: `transformers.GPT2LMHeadModel(GPT2Config(n_layer={args.n_layer}, n_head={args.n_head}, n_embd={args.n_embd}, n_positions={args.n_positions}, vocab_size={args.vocab_size}))`, {n_params:,} parameters, stored as fp32 in `model.safetensors` (no pickle files).
- Load it the way attnscope does: `AutoModel.from_pretrained(folder, attn_implementation="eager", use_safetensors=True)` (gives `GPT2Model`; the tied LM head is not needed) and `AutoTokenizer.from_pretrained(folder)`.
- Tokenizer: byte-level BPE (GPT-2 style, `GPT2TokenizerFast`), vocabulary {args.vocab_size}, trained on the same corpus; `<|endoftext|>` (id 0) is bos/eos/unk.
- Folder size: {folder_bytes / 1e6:.2f} MB.

## Training data and licence

- `pydoc_data.topics.topics` - the English help-topic texts shipped inside CPython ({sys.version.split()[0]}), plus the docstrings (>= 80 characters) of {len(DOC_MODULES)} standard-library modules listed in the script. Both are part of Python and are distributed under the **Python Software Foundation License**. {n_docs} documents, {n_tokens:,} tokens. Nothing was downloaded.
- To make induction heads form, each training sample is, with probability {args.periodic_prob}, random ordinary-word tokens repeated with a period of {args.min_period}-{args.max_period} tokens up to the sample length; with probability {args.repeat_prob}, corpus text containing a span of {args.min_span}-{args.max_span} tokens repeated 2-3 times ({args.random_repeat_frac:.0%} random tokens, otherwise a span of the sample's own text); otherwise plain corpus text. Every sample starts with `<|endoftext|>`; the loss ignores the first (unpredictable) copy of random tokens.

## Training

- Command (from the repository root):

      {command}

- {args.steps} steps of AdamW (lr {args.lr}, betas (0.9, 0.999), {args.warmup} warm-up steps, cosine decay to 10%, weight decay {args.weight_decay} on matrices, gradient clipping 1.0), batch {args.batch_size} x {args.seq_len} tokens, seed {args.seed}, `torch.set_num_threads({args.threads})`, CPU only.
- Measured wall-clock time of the whole script (corpus, tokenizer, training, evaluation): **{wall_s / 60:.1f} minutes** on a 2-core Intel Xeon VM (torch {torch.__version__}).

## How the scores are measured

- Previous-token score of a head: mean over query rows i >= 1 of A[i, i-1] (A = causal attention probabilities), on {len(PREV_TOKEN_SENTENCES)} ordinary English sentences such as "The cat sat on the mat because it was tired." with `<|endoftext|>` prepended as token 0; averaged over the sentences.
- Induction score: `<|endoftext|>` followed by {args.induction_period} distinct random ordinary-word tokens, repeated twice; for every query i in the second copy, attention to key i-({args.induction_period}-1) (the token after the earlier occurrence of token i); averaged over those queries and 5 random sequences.

{format_scores("Previous-token scores", prev)}

{format_scores("Induction scores", ind)}
"""
    path.write_text(card)


# --------------------------------------------------------------------------- #
# Main
# --------------------------------------------------------------------------- #
def main(argv: list[str] | None = None) -> int:
    t0 = time.time()
    args = parse_args(argv)
    command = "nice -n 10 python scripts/train_demo_model.py" + "".join(
        f" {a}" for a in (sys.argv[1:] if argv is None else argv))
    if os.nice(0) < 10:           # leave the other core's work undisturbed
        os.nice(10 - os.nice(0))
    torch.set_num_threads(args.threads)
    set_seeds(args.seed)

    from transformers import AutoModel, AutoTokenizer, GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()

    out_dir: Path = args.out_dir
    log_file = args.log_file or (out_dir / "train.log")
    if out_dir.exists():          # the folder belongs to this script: start clean
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    setup_logging(log_file)
    log.info("args: %s", vars(args))

    docs = build_corpus()
    tok = train_tokenizer(docs, args.vocab_size, args.n_positions)
    bos = tok.bos_token_id
    stream = np.concatenate([np.array(tok(d).input_ids + [bos], dtype=np.int64)
                             for d in docs])                               # (N,)
    log.info("corpus: %d docs, %d chars, %d tokens; %d ordinary words; tokenizer %.1fs",
             len(docs), sum(map(len, docs)), len(stream), len(ordinary_word_ids(tok)),
             time.time() - t0)

    config = GPT2Config(vocab_size=len(tok), n_positions=args.n_positions, n_embd=args.n_embd,
                        n_layer=args.n_layer, n_head=args.n_head, bos_token_id=bos,
                        eos_token_id=bos, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %d parameters", n_params)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr)

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        frac = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * frac)))

    sampler = Sampler(stream, bos, len(tok), ordinary_word_ids(tok), args, np.random.default_rng(args.seed))
    model.train()
    t_train, loss_avg = time.time(), None
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        # Curriculum: copying is learnt first on short periods, then the periods grow to --max-period, so that
        # the induction mechanism has to work over the distances the probe uses.
        ramp = min(1.0, step / max(1, args.curriculum * args.steps))
        sampler.max_period = int(round(args.start_period + ramp * (args.max_period - args.start_period)))
        ids, labels = sampler.batch()                                      # (B, S), (B, S)
        loss = model(input_ids=ids, labels=labels).loss                    # scalar
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_avg = loss.item() if loss_avg is None else 0.95 * loss_avg + 0.05 * loss.item()
        if step % 50 == 0 or step == args.steps - 1:
            el = time.time() - t_train
            log.info("step %5d  loss %.3f  lr %.2e  %.2fs/step  elapsed %.1fmin",
                     step, loss_avg, lr_at(step), el / (step + 1), el / 60)
        if (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            model.eval()
            model.set_attn_implementation("eager")
            prev, ind = previous_token_scores(model, tok), induction_scores(
                model, tok, args.induction_period)
            model.set_attn_implementation("sdpa")
            model.train()
            log.info("eval step %d: best prev-token %s %.3f, best induction %s %.3f",
                     step + 1, *best_head(prev), *best_head(ind))

    # Save: safetensors only (transformers 5 always writes safetensors and no longer
    # takes safe_serialization; older versions need the flag).
    save_kw = ({"safe_serialization": True} if "safe_serialization"
               in inspect.signature(model.save_pretrained).parameters else {})
    model.save_pretrained(out_dir, **save_kw)
    tok.save_pretrained(out_dir)
    for f in out_dir.iterdir():
        if f.suffix in {".bin", ".pt", ".pth", ".pkl", ".ckpt"}:
            raise RuntimeError(f"unexpected pickle file {f}")

    # Reload exactly the way attnscope does and measure there.
    rmodel = AutoModel.from_pretrained(out_dir, attn_implementation="eager",
                                       use_safetensors=True).eval()
    rtok = AutoTokenizer.from_pretrained(out_dir)
    log.info("reloaded: %s, %s; 'The cat sat on the mat.' -> %s", type(rmodel).__name__,
             type(rtok).__name__, rtok.tokenize("The cat sat on the mat."))
    prev = previous_token_scores(rmodel, rtok)
    ind = induction_scores(rmodel, rtok, args.induction_period)
    log.info("\n%s", format_scores("Previous-token scores", prev))
    log.info("\n%s", format_scores("Induction scores", ind))
    (pb, pv), (ib, iv) = best_head(prev), best_head(ind)
    ok = pv >= args.prev_target and iv >= args.induction_target
    log.info("best previous-token head: %s score %.3f (target %.2f)", pb, pv, args.prev_target)
    log.info("best induction head:      %s score %.3f (target %.2f)", ib, iv, args.induction_target)

    wall = time.time() - t0
    (out_dir / "scores.json").write_text(json.dumps({
        "previous_token": prev.tolist(), "induction": ind.tolist(),
        "best_previous_token": {"head": pb, "score": pv},
        "best_induction": {"head": ib, "score": iv}, "wall_seconds": round(wall, 1)}, indent=2))
    card_args = (out_dir / "MODEL_CARD.md", args, command, n_params, len(docs), len(stream),
                 wall, prev, ind)
    write_model_card(*card_args, folder_bytes=0, ok=ok)
    size = sum(f.stat().st_size for f in out_dir.iterdir())
    write_model_card(*card_args, folder_bytes=size, ok=ok)    # again, with the real size
    log.info("wall time %.1f min; folder %s (%.2f MB)", wall / 60, out_dir,
             sum(f.stat().st_size for f in out_dir.iterdir()) / 1e6)
    if not ok:
        log.error("targets NOT met")
        return 1
    log.info("targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
