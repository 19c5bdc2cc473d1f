"""Interventions on a model's forward pass: hooks that gate, record or cut it short, and a temporary change of the
attention implementation or of the weights' gradients, each undone by the context manager that made it.

One mechanism, many cases (TransformerLens' `HookedRootModule.hooks()`, on which its `run_with_hooks` is built):
every kind of hook is a small object that says where it goes by layer, found through the model's family, and
`hooks(loaded, *kinds)` installs them all and removes, in `finally`, every handle it installed, even when a forward
raises or a kind fails halfway through its installation. The analyses hold the kinds and read what they recorded.

    HeadGates                 each head's output times a gate, where the output projection takes it in, or moved
                              towards a replacement (ablate, circuit's gradient; `pipeline.ablation` says what)
    PatchedHeads              chosen heads' outputs replaced by given values, per copy of the batch, head and
                              position (patch)
    HeadOutputsRecorder       every layer's heads' outputs, as the output projection takes them in (patch)
    LayerOutputsRecorder      what every layer returned (patch)
    SkippedLayers             the layers below one return what they returned in an earlier run, without computing
                              (patch: a change in layer l leaves the layers below it as they were)
    LayerInputsRecorder       what each layer received, and its heads' outputs: what circuit's replay starts from
    AttentionWeightsRecorder  the attention probabilities with their graph, and the keys each row sees (circuit's
                              gradient)
    DirectPathRecorder        the σ of the norms on the direct paths, chosen modules' outputs, and each layer's heads'
                              outputs handed to a function (direct effects)
    ReplacedAttention         a layer's attention module computing with another function (circuit's replay)
    StopAfterAttention        `Stop` raised once a layer's attention has run (a replay that has all it needs)

    gates, recorder = HeadGates(), AttentionWeightsRecorder()
    with attention(loaded, "eager"), hooks(loaded, gates, recorder):
        gates.values = ...  # (B, L, H)
        loaded.model(input_ids=..., attention_mask=...)

The heads' outputs are read and gated on the input of the output projection W_O (GPT-2's `attn.c_proj`, BERT's
`attention.output.dense`): the heads side by side, head h in columns h·d_head .. (h+1)·d_head. transformers v5 has
no `head_mask`.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from attnscope.errors import AttnscopeError

if TYPE_CHECKING:
    from attnscope.models.loading import LoadedModel
    from attnscope.models.weights import Norm

# Copies of a batch run at once, one per head configuration (`ablate`) or one per removed head (circuit's replay):
# bounds the activations at copies × padded tokens.
MAX_COPY_TOKENS = 8192


class Handle(Protocol):
    """What undoes one installed hook (torch's `RemovableHandle`, or `RestoredForward`)."""

    def remove(self) -> None: ...


class Hook(Protocol):
    """A kind of hook: `install` registers its hooks on `loaded`'s modules and yields each handle as soon as it is
    registered, so that `hooks` can remove those already in place if a later one fails."""

    def install(self, loaded: LoadedModel) -> Iterator[Handle]: ...


@contextlib.contextmanager
def hooks(loaded: LoadedModel, *kinds: Hook) -> Iterator[tuple[Hook, ...]]:
    """Install every kind of hook in `kinds` on `loaded`'s model, in order; yields `kinds`; removes every hook it
    installed when the block ends, however it ends (the last installed first)."""
    handles: list[Handle] = []
    try:
        for kind in kinds:
            for handle in kind.install(loaded):
                handles.append(handle)
        yield kinds
    finally:
        for handle in reversed(handles):
            handle.remove()


@contextlib.contextmanager
def attention(loaded: LoadedModel, implementation: str) -> Iterator[None]:
    """The model computes attention with `implementation` ("eager": the probabilities themselves; "sdpa" or
    `models.loading.fastest_attention`'s choice where no weights are needed) inside the block, with the one it had
    before after it, however the block ends."""
    previous = loaded.config._attn_implementation
    loaded.model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        loaded.model.set_attn_implementation(previous)


@contextlib.contextmanager
def weights_frozen(loaded: LoadedModel) -> Iterator[None]:
    """The model's weights need no gradient inside the block (those that needed one need it again after): where only
    the gates' gradients are wanted, the weights' would cost every backward pass a matrix product per layer."""
    weights = [parameter for parameter in loaded.model.parameters() if parameter.requires_grad]
    for parameter in weights:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in weights:
            parameter.requires_grad_(True)


# ------------------------------------------------------------------------------------------------- gates


class HeadOutputsHook:
    """A forward pre-hook on every layer's output projection, whose input holds the heads' outputs side by side:
    `_hook(layer, n_head)` makes the layer's (what `HeadGates`, `PatchedHeads` and `HeadOutputsRecorder` do there)."""

    def install(self, loaded: LoadedModel) -> Iterator[Handle]:
        for layer, module in enumerate(loaded.family.output_projections(loaded.model)):
            yield module.register_forward_pre_hook(self._hook(layer, loaded.n_head))

    def _hook(self, layer: int, n_head: int) -> Callable:
        raise NotImplementedError


class HeadGates(HeadOutputsHook):
    """Forward pre-hooks on every layer's output projection multiplying each head's output by a gate.

    `values` is (B, L, H): one row of gates per sequence of the batch, so one forward pass can run the same window
    under many head configurations (1 = kept, 0 = removed; a gate that requires grad gives ∂/∂ξ). None switches the
    gates off (the model runs unchanged). `replacements` (layer -> r, see `pipeline.ablation`) says what a removed
    head's output becomes: the output is x·ξ + r·(1 − ξ), r broadcastable to (b, n, H, d_head), b 1 or the windows
    that `values` repeats in B / b copies (configuration-major, as `ablate` runs them); none for a layer: 0.
    """

    def __init__(self) -> None:
        self.values: Any = None
        self.replacements: dict[int, Any] | None = None

    def _hook(self, layer: int, n_head: int) -> Callable:
        def gate_heads(module, args):
            if self.values is None:
                return None
            x = args[0]  # (B, n, d) the heads' outputs side by side, head h in columns h·d_head .. (h+1)·d_head
            B, n, d = x.shape
            gate = self.values[:, layer].to(x.dtype).expand(B, n_head)  # (B, H)
            gated = x.view(B, n, n_head, d // n_head) * gate[:, None, :, None]  # (B, n, H, d_head)
            replacement = None if self.replacements is None else self.replacements.get(layer)
            if replacement is not None:  # + r·(1 − ξ): what a removed head's output becomes
                b = replacement.shape[0]
                r = replacement[:, :n].to(x.dtype)  # (b, n or 1, H, d_head)
                off = (1 - gate).view(B // b, b, 1, n_head, 1)  # (copies, b, 1, H, 1)
                gated = (gated.view(B // b, b, n, n_head, -1) + r * off).view(B, n, n_head, -1)
            return (gated.reshape(B, n, d),) + tuple(args[1:])

        return gate_heads


class PatchedHeads(HeadOutputsHook):
    """Forward pre-hooks on every layer's output projection replacing chosen heads' outputs by given values.

    The batch is C copies of B rows, copy-major (row c·B + b is copy c of row b: one forward pass runs several
    configurations, as `HeadGates`' rows do). For each layer in `chosen`, `chosen[layer]` is a bool tensor
    broadcastable to (C, B, n, H), True where the head's output at that position is replaced, its first dimension
    the number of copies C; `values[layer]` is broadcastable to (C, B, n, H, d_head): the outputs put there, e.g.
    (B, n, H, d_head), the same for every copy (another input's outputs: patching, resample ablation), or
    (H, d_head) (a mean: mean ablation). A layer not in `chosen` runs unchanged; `chosen` empty: the model does.
    """

    def __init__(self) -> None:
        self.chosen: dict[int, Any] = {}
        self.values: dict[int, Any] = {}

    def _hook(self, layer: int, n_head: int) -> Callable:
        import torch

        def patch_heads(module, args):
            chosen = self.chosen.get(layer)
            if chosen is None:
                return None
            x = args[0]  # (C·B, n, H·d_head) the heads' outputs side by side
            copies = chosen.shape[0]
            rows, n, d = x.shape
            heads = x.view(copies, rows // copies, n, n_head, d // n_head)  # (C, B, n, H, d_head)
            values = self.values[layer].to(device=x.device, dtype=x.dtype)
            patched = torch.where(chosen.to(x.device)[..., None], values, heads)  # (C, B, n, H, d_head)
            return (patched.reshape(rows, n, d),) + tuple(args[1:])

        return patch_heads


class HeadOutputsRecorder(HeadOutputsHook):
    """Forward pre-hooks on every layer's output projection keeping a copy of its input, the heads' outputs side by
    side, as `outputs[layer]` (B, n, H, d_head), from the last forward pass."""

    def __init__(self) -> None:
        self.outputs: dict[int, Any] = {}

    def _hook(self, layer: int, n_head: int) -> Callable:
        def record(module, args):
            x = args[0]  # (B, n, H·d_head)
            self.outputs[layer] = x.detach().reshape(*x.shape[:2], n_head, -1).clone()  # (B, n, H, d_head)

        return record


class LayerOutputsRecorder:
    """Forward hooks on every layer keeping what it returned (a tensor (B, n, d), or a tuple whose first element is
    one), as `outputs[layer]`, from the last forward pass: what `SkippedLayers` returns in a later run."""

    def __init__(self) -> None:
        self.outputs: dict[int, Any] = {}

    def install(self, loaded: LoadedModel) -> Iterator[Handle]:
        for layer, module in enumerate(loaded.family.layers(loaded.model)):
            yield module.register_forward_hook(self._hook(layer))

    def _hook(self, layer: int) -> Callable:
        def record(module, args, output):
            self.outputs[layer] = output

        return record


# ------------------------------------------------------------------------------------------------- recorders


class LayerInputsRecorder:
    """Notes, while one batch runs forward, what a replay from layer l needs (`analyses.circuit_replay`): what each
    layer up to `top` received (`calls`: its arguments, the hidden states cloned), each layer's heads' outputs z
    below `top` (`z`: the output projection's input, (B, n, H·d_head)), and the form of each attention module's
    output below `top` (`outputs`: a tuple or not, and the elements after the first)."""

    def __init__(self, top: int):
        self.top = top
        self.calls: dict[int, tuple[tuple, dict]] = {}
        self.z: dict[int, Any] = {}
        self.outputs: dict[int, tuple[bool, tuple]] = {}  # layer -> (a tuple?, the elements after the first)

    def install(self, loaded: LoadedModel) -> Iterator[Handle]:
        family, network = loaded.family, loaded.model
        for layer, module in enumerate(family.layers(network)[: self.top + 1]):
            yield module.register_forward_pre_hook(self._call(layer), with_kwargs=True)
        for layer in range(self.top):
            yield family.output_projections(network)[layer].register_forward_pre_hook(self._z(layer))
            yield family.attention_modules(network)[layer].register_forward_hook(self._output(layer))

    def _call(self, layer: int) -> Callable:
        def record(module, args, kwargs):
            if args:
                args = (args[0].clone(), *args[1:])
            else:
                kwargs = {**kwargs, "hidden_states": kwargs["hidden_states"].clone()}
            self.calls[layer] = (args, dict(kwargs))

        return record

    def _z(self, layer: int) -> Callable:
        def record(module, args):
            self.z[layer] = args[0].clone()  # (B, n, H·d_head)

        return record

    def _output(self, layer: int) -> Callable:
        def record(module, args, output):
            is_tuple = isinstance(output, tuple)
            self.outputs[layer] = (is_tuple, tuple(output[1:]) if is_tuple else ())

        return record


class AttentionWeightsRecorder:
    """Forward hooks on every attention module keeping, for the layers in `layers` (set before each forward), the
    attention probabilities the module returns (B, H, n, n_k) with their graph (`probs`), and the keys each row sees
    (B, n, n_k) from the mask it got (`visible`; None where it got none). Needs eager attention: SDPA returns no
    weights."""

    def __init__(self) -> None:
        self.layers: frozenset[int] = frozenset()
        self.probs: dict[int, Any] = {}
        self.visible: dict[int, Any] = {}

    def install(self, loaded: LoadedModel) -> Iterator[Handle]:
        for layer, module in enumerate(loaded.family.attention_modules(loaded.model)):
            yield module.register_forward_hook(self._hook(layer, inspect.signature(module.forward)), with_kwargs=True)

    def _hook(self, layer: int, signature: inspect.Signature) -> Callable:
        def record(module, args, kwargs, output):
            if layer not in self.layers:
                return
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if weights is None:
                raise AttnscopeError(f"layer {layer}'s attention returned no weights: its gradient cannot be taken")
            mask = signature.bind_partial(*args, **kwargs).arguments.get("attention_mask")
            self.probs[layer] = weights
            self.visible[layer] = _visible(mask, weights)

        return record


def _visible(mask: Any, weights: Any) -> Any:
    """(B, n, n_k) bool: the keys a row sees, from the mask eager attention was given (additive, 0 where allowed,
    the dtype's lowest value where not; or boolean); None when it was given none (the kind's geometry then)."""

    if mask is None:
        return None
    B, _, n, n_keys = weights.shape
    allowed = _allowed(mask[..., :n, :n_keys])  # (B or 1, 1 or H, n, n_k)
    return allowed.any(1).expand(B, n, n_keys)  # a mask per head (StreamingHeads'): the keys any head sees


class DirectPathRecorder:
    """Records, in one forward pass, what a head's direct effect needs (`analyses.direct_effect`): the denominator σ
    (B, n) and the input of every norm in `norms` (forward pre-hooks: `scales`, `inputs`, by the norm module's id),
    the output of each module in `outputs` (`outputs`, by id; a tuple's first element), and each layer's heads'
    outputs as the output projection receives them (B, n, H·d_head), handed to `on_heads(layer, x)` as they come."""

    def __init__(self, norms: Sequence[Norm], on_heads: Callable[[int, Any], None], outputs: Sequence[Any] = ()):
        self.norms = {id(norm.module): norm for norm in norms}  # a norm on several paths is hooked once
        self.on_heads = on_heads
        self.modules = list(outputs)
        self.scales: dict[int, Any] = {}
        self.inputs: dict[int, Any] = {}
        self.outputs: dict[int, Any] = {}

    def install(self, loaded: LoadedModel) -> Iterator[Handle]:
        for norm in self.norms.values():
            yield norm.module.register_forward_pre_hook(self._scale(norm))
        for layer, module in enumerate(loaded.family.output_projections(loaded.model)):
            yield module.register_forward_pre_hook(lambda module, args, layer=layer: self.on_heads(layer, args[0]))
        for module in self.modules:
            yield module.register_forward_hook(self._output)

    def _scale(self, norm: Norm) -> Callable:
        def record(module, args):
            self.scales[id(module)] = norm.scale(args[0])  # (B, n)
            self.inputs[id(module)] = args[0]

        return record

    def _output(self, module: Any, args: Any, output: Any) -> None:
        self.outputs[id(module)] = output[0] if isinstance(output, tuple) else output

    def scale_of(self, norm: Norm) -> Any:
        return self.scales[id(norm.module)]


# ------------------------------------------------------------------------------------------------- the replay's


class Stop(Exception):
    """Raised by `StopAfterAttention` once the forward has computed all it needs, to leave the layer it is in."""


class StopAfterAttention:
    """A forward hook on layer `layer`'s attention module raising `Stop` once it has run: what follows it (the rest of
    the layer, the layers above) is not computed. The caller catches `Stop`."""

    def __init__(self, layer: int):
        self.layer = layer

    def install(self, loaded: LoadedModel) -> Iterator[Handle]:
        yield loaded.family.attention_modules(loaded.model)[self.layer].register_forward_hook(self._stop)

    @staticmethod
    def _stop(module: Any, args: Any, output: Any) -> None:
        raise Stop


class ReplacedAttention:
    """Layer `layer`'s attention module computes `forward(*args, **kwargs)` instead of its own: an instance
    attribute, which `nn.Module.__call__` finds before the class's method (its hooks still run)."""

    def __init__(self, layer: int, forward: Callable[..., Any]):
        self.layer = layer
        self.forward = forward

    def install(self, loaded: LoadedModel) -> Iterator[Handle]:
        yield RestoredForward(loaded.family.attention_modules(loaded.model)[self.layer], self.forward)


class SkippedLayers:
    """The layers below `below` compute nothing: layer j returns `outputs[j]` (what it returned in an earlier run of
    the same batch: `LayerOutputsRecorder`), its hidden states repeated `copies` times along the batch (copy-major, as
    `PatchedHeads` reads the batch). A run whose changes all lie in layer `below` or above computes only those layers:
    the ones below would compute what they did before."""

    def __init__(self, outputs: dict[int, Any], below: int, copies: int):
        self.outputs, self.below, self.copies = outputs, below, copies

    def install(self, loaded: LoadedModel) -> Iterator[Handle]:
        for layer, module in enumerate(loaded.family.layers(loaded.model)[: self.below]):
            yield RestoredForward(module, self._recorded(layer))

    def _recorded(self, layer: int) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            output = self.outputs[layer]
            if isinstance(output, tuple):
                return (output[0].repeat(self.copies, 1, 1), *output[1:])
            return output.repeat(self.copies, 1, 1)  # (C·B, n, d)

        return forward


def _allowed(mask: Any) -> Any:
    """A mask as booleans (True: the key is seen), from an additive one (0 where allowed, the dtype's lowest value
    where not) or a boolean one."""
    import torch

    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


class RestoredForward:
    """`module.forward` set to `forward`; `remove` puts back what the instance had (nothing, usually: the class's
    method again)."""

    def __init__(self, module: Any, forward: Callable[..., Any]):
        self.module = module
        self.before = module.__dict__.get("forward")
        module.forward = forward

    def remove(self) -> None:
        if self.before is None:
            del self.module.forward
        else:
            self.module.forward = self.before
