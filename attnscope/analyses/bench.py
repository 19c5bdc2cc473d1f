"""`attnscope bench`: how much the analysis costs over the model's own forward pass, and against what users do today.

Methods, on the same random token ids, batch shape and device:
- `floor`: the base model with PyTorch SDPA attention and no attention returned: the cheapest forward there is.
- `attnscope`: the full per-head analysis (every statistic of `attnscope heads`; the probe excluded), computed by
  the kernel `kernel` chooses (auto: the fused Triton kernel on CUDA when Triton imports, else the block path).
- `fused`, `blocks` (only when asked for): the same analysis with the fused kernel, or the block path, whatever
  `kernel` says, to compare the two in one table (`fused` on the CPU runs Triton's interpreter: for testing only).
- `tutorial`: the multi-head-attention tutorials' way: the LM-head model with eager attention and
  `output_attentions=True`, one text at a time, every map copied to numpy on the host and scored there.
- `cache`: TransformerLens-style caching: one prompt at a time, every layer's attention pattern kept in a cache,
  then scored (TransformerLens's `detect_head` scores a head by the share of its attention on a pattern).
- `circuit`, `circuit-naive` (only when asked for): `attnscope circuit`'s removals without the probe: every head of
  layer 1 and above explained by its row statistics, each earlier head removed (mean ablation, circuit's default),
  replayed from its layer (`circuit`) or by one full forward per removed head, every layer scored (`circuit-naive`,
  the reference).
- `kvplan` (only when asked for): `attnscope kvplan`'s score on the texts given (the probe and the plan excluded):
  each row's attention on the keys a streaming cache drops, with its default sink and recent window.
- `diversity`, `diversity-sampled` (only when asked for): `attnscope diversity --layer all`'s reduction, every pair
  of heads of all layers, exact or with JS on `sample_rows` random rows per window; batches sized as that
  command sizes them (all layers' maps of a batch within its memory budget).

Timing: `warmup` untimed rounds of every method, then `repeats` rounds; each round runs every method once timed and
once for its memory, in an order rotated by one method per round (round-robin), so that drift in the machine's load
falls on every method alike. A timed run lasts at least SAMPLE_S: a call shorter than that (a small model's forward
takes a millisecond or two) is repeated and the time of one call reported, attnscope's calls being the batches of
one run, as `heads` runs a corpus. Reported: the median time and its spread, (max - min) / median. On CUDA,
events with a synchronisation; on CPU, perf_counter. Memory, the median over the rounds of one run's peak: CUDA
`max_memory_allocated` above what was allocated before the run; on CPU the peak resident set size above the size
before the run, sampled every millisecond by a thread, after freed memory is handed back to the OS (glibc
malloc_trim) so that the run's own allocations show. The memory runs are not the timed ones: the sampling thread
and the memory handed back would slow a timed run. The harness that measures is `analyses.harness`; the
tutorials' micro-benchmark (`--micro`) is `analyses.micro_bench`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attnscope import options, settings
from attnscope.analyses.bench_limits import BASELINES, check_context, check_memory, check_settings
from attnscope.analyses.common import planned_work
from attnscope.analyses.harness import Measurement, measure
from attnscope.analyses.micro_bench import MICRO_D_MODEL, micro_benchmark
from attnscope.analyses.result import Result
from attnscope.errors import AttnscopeError
from attnscope.models.families import family_of
from attnscope.models.loading import fastest_attention, load_config, load_model, resolve_device, resolve_dtype
from attnscope.output.bench import BenchView
from attnscope.pipeline import capture, kernels
from attnscope.scores.catalog import counted
from attnscope.settings import Planned

METHODS = options.BENCH_METHODS  # the default set
DIVERSITY_METHODS = options.BENCH_DIVERSITY_METHODS
KERNEL_METHODS = options.BENCH_KERNEL_METHODS  # the analysis with one kernel or the other
ALL_METHODS = options.ALL_BENCH_METHODS
MEASURABLE = 2**20  # bytes: a floor's peak below this is too small (and too noisy) to divide another peak by
DEFAULT_SAMPLE_ROWS = settings.Bench.sample_rows  # rows per window of `diversity-sampled` (--sample-rows)
# A timed sample lasts at least this long (calls of a short forward are repeated to fill it; see harness.measure),
# and makes at most harness.MAX_CALLS calls.
SAMPLE_S = 0.1


def numpy_head_scores(maps: np.ndarray) -> dict[str, np.ndarray]:
    """The tutorial baseline's scoring on the host: maps (H, n, n) of one text -> per-head means over rows i >= 1."""
    n = maps.shape[-1]
    rows = np.arange(1, n)
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.nansum(np.where(maps > 0, maps * np.log(maps), 0.0), axis=-1)  # (H, n)
    return {
        "previous_token": maps[:, rows, rows - 1].mean(-1),
        "first_token": maps[:, rows, 0].mean(-1),
        "self": maps[:, rows, rows].mean(-1),
        "entropy": entropy[:, 1:].mean(-1),
        "confidence": maps[:, 1:].max(-1).mean(-1),
    }


def pattern_share(pattern: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """TransformerLens detect_head-style score: share of each head's attention on a 0/1 pattern. attn (H, n, n)."""
    return (attn * pattern).sum(dim=(-1, -2)) / attn.sum(dim=(-1, -2))


def _methods(
    lm_model: Any,
    ids: torch.Tensor,
    device: torch.device,
    sample_rows: int = DEFAULT_SAMPLE_ROWS,
    kernel: str = "auto",
) -> dict[str, Callable[[int], Any]]:
    """Every method on `lm_model` (the model with its LM head; its base model is what attnscope analyses), each
    called with how many times to run (`measure`); `attnscope` with the kernel of `kernel`."""
    from attnscope.pipeline.reducers import HeadStatistics
    from attnscope.pipeline.tokens import Batch

    model = lm_model.base_model
    B, n = ids.shape
    mask = torch.ones_like(ids)
    batch = Batch(list(range(B)), ids, mask, torch.full((B,), n, device=device))
    n_layer, n_head = model.config.num_hidden_layers, model.config.num_attention_heads
    kind = family_of(model.config).kind
    fastest = fastest_attention(model)

    def floor(calls: int = 1) -> None:
        with torch.inference_mode():
            if model.config._attn_implementation != fastest:  # another method switched it: not part of a forward
                model.set_attn_implementation(fastest)
            for _ in range(calls):
                model(input_ids=ids, attention_mask=mask, use_cache=False)  # no key/value cache: nothing is generated

    def analysis(calls: int = 1, kernel: str = kernel) -> Any:
        # `calls` batches analysed in one run, as `heads` runs a corpus batch after batch: what a run does once
        # (switching the model's attention, the means) is shared by its batches
        statistics = HeadStatistics(kind, n_layer, n_head, device)
        capture.run(model, [batch] * calls, statistics, kernel=kernel)
        return statistics.means()

    def one_text_at_a_time(calls: int, scored: Callable[[Any], Any]) -> list:
        """The notebook ways: the LM-head model with every layer's attention returned, one text at a time, each
        text's attentions handed to `scored`."""
        lm_model.set_attn_implementation("eager")
        for _ in range(calls):
            results = []
            with torch.inference_mode():
                for row in range(B):
                    results.append(scored(lm_model(input_ids=ids[row : row + 1], output_attentions=True).attentions))
        return results

    def tutorial(calls: int = 1) -> list:
        return one_text_at_a_time(
            calls, lambda attentions: [numpy_head_scores(layer[0].float().cpu().numpy()) for layer in attentions]
        )

    def cache(calls: int = 1) -> list:
        # the previous-token pattern (n, n), built only when this method runs: 4.3 GB at 32,768 tokens
        previous = torch.zeros(n, n, device=device)
        previous[torch.arange(1, n), torch.arange(n - 1)] = 1.0

        def shares(attentions: Any) -> dict:
            cached = {f"blocks.{layer}.attn.hook_pattern": a[0] for layer, a in enumerate(attentions)}
            return {name: pattern_share(previous, attn.float()) for name, attn in cached.items()}

        return one_text_at_a_time(calls, shares)

    def kvplan(calls: int = 1) -> Any:
        # like `analysis`, with kvplan's reducer and its default sink and recent window
        from attnscope.pipeline.reducers import DistantAttention

        sums = DistantAttention(n_layer, n_head, device, settings.Kvplan.sink, settings.Kvplan.recent)
        capture.run(model, [batch] * calls, sums, kernel=kernel)
        return sums.means()

    def diversity(rows: int, calls: int = 1) -> Any:
        # like `analysis`: `calls` passes over the batch in one run
        from attnscope.analyses.diversity import diversity_statistics, layers_batch_size

        layers = list(range(n_layer))
        size = layers_batch_size(B, len(layers), n_head, n)
        statistics = diversity_statistics(kind, layers, n_head, device, rows, seed=0)
        parts = [
            Batch(list(range(i, min(B, i + size))), ids[i : i + size], mask[i : i + size], batch.lengths[i : i + size])
            for i in range(0, B, size)
        ]
        capture.run(model, parts * calls, statistics, on_batch=statistics.flush)
        return statistics.results()

    def circuit(naive: bool, calls: int = 1) -> Any:
        # every head of layer 1 and above explained by its row statistics, each earlier head removed (replayed from
        # its layer, or the naive way: one full forward per removed head); `calls` passes over the batch
        from attnscope.analyses.circuit_naive import timed_pass
        from attnscope.models.loading import LoadedModel

        loaded = LoadedModel("bench", model, None, device, family_of(model.config), kernel=kernel)
        return timed_pass(loaded, [batch] * calls, naive)

    return {
        "floor": floor,
        "attnscope": analysis,
        "fused": lambda calls=1: analysis(calls, "fused"),
        "blocks": lambda calls=1: analysis(calls, "blocks"),
        "tutorial": tutorial,
        "cache": cache,
        "kvplan": kvplan,
        "diversity": lambda calls=1: diversity(0, calls),
        "diversity-sampled": lambda calls=1: diversity(sample_rows, calls),
        "circuit": lambda calls=1: circuit(False, calls),
        "circuit-naive": lambda calls=1: circuit(True, calls),
    }


def run_bench(
    lm_model: Any,
    device: torch.device,
    seqs: Sequence[int],
    batches: Sequence[int],
    warmup: int = 1,
    repeats: int = 3,
    methods: Sequence[str] = METHODS,
    seed: int = 0,
    sample_rows: int = DEFAULT_SAMPLE_ROWS,
    status: Callable[[str], None] | None = None,
    kernel: str = "auto",
) -> list[Measurement]:
    """Every method at every (batch, seq) on `lm_model` (a decoder with its LM head, eval mode), on the same random
    token ids; `attnscope` with the kernel of `kernel`; `status` is told which shape is being timed."""
    generator = torch.Generator().manual_seed(seed)
    results = []
    shapes = [(batch_size, seq) for batch_size in batches for seq in seqs]
    for done, (batch_size, seq) in enumerate(shapes):
        if status is not None:
            status(f"timing {', '.join(methods)} at {batch_size} × {seq} ({done + 1} of {len(shapes)}) …")
        ids = torch.randint(0, lm_model.config.vocab_size, (batch_size, seq), generator=generator).to(device)
        runs = _methods(lm_model, ids, device, sample_rows, kernel)
        measured = measure({method: runs[method] for method in methods}, device, warmup, repeats, sample_s=SAMPLE_S)
        for method, (times, peaks) in measured.items():
            results.append(Measurement(method, batch_size, seq, times, peaks))
    lm_model.set_attn_implementation("eager")
    return results


def records(measurements: Sequence[Measurement]) -> list[dict]:
    """One record per measurement, with ratios to the other methods of the same (batch, seq):

    - `time_vs_floor`, `time_vs_tutorial`, `time_vs_cache`: this method's median time / that method's (below 1:
      faster than it), on every record where that method was timed;
    - `memory_vs_floor`: this method's peak memory / the floor's (None where the floor's peak is under MEASURABLE,
      1 MB: a small model's peaks are noise, and a ratio of them would read as a finding);
    - `speedup_vs_tutorial`, `speedup_vs_cache` (attnscope's records only): the baseline's median time /
      attnscope's (2.0: attnscope takes half the time), the inverse of attnscope's `time_vs_*`;
    - `runs`: the timed runs behind the median (`spread` of a single run is 0, and means nothing)."""
    by_config = {(m.method, m.batch, m.seq): m for m in measurements}
    out = []
    for m in measurements:
        floor = by_config.get(("floor", m.batch, m.seq))
        record = {
            "method": m.method,
            "batch": m.batch,
            "seq": m.seq,
            "runs": len(m.times),
            "median_s": m.median,
            "min_s": min(m.times),
            "max_s": max(m.times),
            "spread": m.spread,
            "tokens_per_s": m.tokens_per_second,
            "time_vs_floor": m.median / floor.median if floor else None,
            "peak_mb": m.peak_bytes / 2**20,
            "memory_vs_floor": m.peak_bytes / floor.peak_bytes if floor and floor.peak_bytes >= MEASURABLE else None,
        }
        for baseline in BASELINES:
            other = by_config.get((baseline, m.batch, m.seq))
            record[f"time_vs_{baseline}"] = m.median / other.median if other else None
        for baseline in BASELINES:
            other = by_config.get((baseline, m.batch, m.seq))
            record[f"speedup_vs_{baseline}"] = other.median / m.median if m.method == "attnscope" and other else None
        out.append(record)
    return out


def random_model(config: Any, device: torch.device, dtype: Any) -> Any:
    """The architecture of `config` with its LM head and random weights (timing does not depend on weight values)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    family_of(config).prepare(model.base_model)
    return model.to(device=device, dtype=None if dtype == "auto" else dtype).eval()


@dataclass(repr=False)  # the repr is Result's: a summary
class BenchResult(Result):
    view_class = BenchView  # how it is shown (--json, --csv, --out, the terminal, a notebook)

    model: dict[str, Any]  # name and shape of the model timed
    settings: dict[str, Any]  # what was asked, and the machine it ran on
    rows: list[dict]  # `records` of every measurement
    micro: list[dict]  # `micro_benchmark` rows (empty without it)
    notes: list[str] = field(default_factory=list)


def _check_family(config: Any) -> None:
    """The bench's baselines run a language model one text at a time: a decoder's."""
    if not family_of(config).kind.causal:
        raise AttnscopeError(
            f"bench times decoders (its baselines are next-token language models); model type '{config.model_type}' "
            "is an encoder"
        )


class Bench(settings.Bench):
    """Time every method at every batch size × sequence length on `model` (or its architecture with random
    weights, with `random_weights` or when the weights are unavailable; GPT-2 small's when even its config is).
    Every setting and the model's config are checked before any weights are loaded or built."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_settings(self.seq_lens, self.batch_sizes, self.repeats, self.warmup)
        resolve_dtype(self.dtype)
        device = resolve_device(self.device)  # --device cuda on a machine without CUDA stops here, before any model
        if self.kernel == "fused" or "fused" in self.methods:  # Triton missing: one line now, not after the warm-up
            kernels.decide("fused", device)

    def _planned(self, network: Any) -> str | None:
        """The timed runs, when large: every method at every shape, warm-up and repeats (at least; a fast one repeats
        until it has run SAMPLE_S)."""
        shapes = [(batch, seq) for batch in self.batch_sizes for seq in self.seq_lens]
        each = len(self.methods) * (self.warmup + self.repeats)
        return planned_work(
            network,
            each * len(shapes),
            each * sum(batch * seq for batch, seq in shapes),
            f"bench times {counted(len(self.methods), 'method')} at {counted(len(shapes), 'shape')} (--batch-sizes × "
            f"--seq-lens), {self.warmup} warm-up + {counted(self.repeats, 'timed run')} each",
            "fewer or shorter --seq-lens, fewer --batch-sizes, --methods or --repeats make it smaller",
        )

    def run(self, model: str, status: Callable[[str], None] | None = None) -> BenchResult:
        """Load (or build) the model named `model` and time it; `status` is told what is being done."""
        if not isinstance(model, str):
            raise AttnscopeError("bench loads the model itself (or builds it with random weights): give its name")
        device = resolve_device(self.device)
        notes: list[str] = []
        network, name = self._network(model, device, notes, status)
        planned = self._planned(network)
        if planned and status is not None:
            status(Planned(planned))
        measurements = run_bench(
            network,
            device,
            self.seq_lens,
            self.batch_sizes,
            self.warmup,
            self.repeats,
            self.methods,
            sample_rows=self.sample_rows,
            status=status,
            kernel=self.kernel,
        )
        kernel = kernels.decide(self.kernel, device)  # what computed the `attnscope` rows
        if "fused" in self.methods or (kernel == "fused" and "attnscope" in self.methods):
            from attnscope.pipeline import fused

            if fused.interpreted():
                notes.append(kernels.INTERPRETER_NOTE)
        machine = {
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "cpu_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "dtype": str(next(network.parameters()).dtype).removeprefix("torch."),
        }
        settings = {
            "seq_lens": list(self.seq_lens),
            "batch_sizes": list(self.batch_sizes),
            "repeats": self.repeats,
            "warmup": self.warmup,
            "methods": list(self.methods),
            "sample_rows": self.sample_rows,
            "micro_d_model": MICRO_D_MODEL,
            "kernel": kernel,
            **machine,
        }
        config = network.config
        shape = {
            "name": name,
            "model_type": config.model_type,
            "n_layer": config.num_hidden_layers,
            "n_head": config.num_attention_heads,
            "n_kv_head": getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            "d_model": config.hidden_size,
            "floor": fastest_attention(network.base_model),
        }
        micro: list[dict] = []
        if self.micro:
            micro, skipped = micro_benchmark(
                seqs=self.seq_lens,
                batches=self.batch_sizes,
                repeats=self.repeats,
                device=device,
                warmup=self.warmup,
                status=status,
            )
            notes.extend(skipped)
        return BenchResult(shape, settings, records(measurements), micro, notes)

    def _network(
        self, model: str, device: torch.device, notes: list[str], status: Callable[[str], None] | None = None
    ) -> tuple[Any, str]:
        from transformers import GPT2Config

        config = load_config(model, self.revision)
        known = config is not None
        config = config if known else GPT2Config()  # GPT-2 small's architecture when even the config is missing
        _check_family(config)
        check_context(self.seq_lens, config.max_position_embeddings)
        dtype = resolve_dtype(self.dtype)
        stored = getattr(config, "dtype", None)  # the checkpoint's own, a torch.dtype or its name
        stored = getattr(torch, stored, None) if isinstance(stored, str) else stored
        element = (dtype if dtype != "auto" else stored if isinstance(stored, torch.dtype) else torch.float32).itemsize
        check_memory(config, self.seq_lens, self.batch_sizes, self.methods, device, element)
        say = status or (lambda text: None)
        if not self.random_weights:
            say(f"loading {model} …")
            try:
                loaded = load_model(model, str(device), self.dtype, lm_head=True, revision=self.revision)
                return loaded.lm_model, model
            except AttnscopeError as error:
                notes.append(f"weights unavailable ({error}); timing random weights instead")
        if not known:
            notes.append(f"config of '{model}' unavailable; using GPT-2 small's architecture")
        say(f"building {model if known else 'GPT-2 small'} with random weights …")
        return random_model(config, device, dtype), f"{model} (random weights)"
