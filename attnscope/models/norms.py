"""A norm read from its module (LayerNorm or RMSNorm, of any family) as the weight-based analyses use it: its γ and β,
its per-token denominator, and its Jacobian's products (`jvp`, `vjp`) for the direct effects and the edges' gradients.
Which norm feeds which layer is `models.weights`' (`reading_norms`, `output_norms`) and `models.readout`'s
(`final_norm`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError

if TYPE_CHECKING:
    import torch


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """x in float32, or as it is when wider (float64: a model a test runs in double precision keeps it)."""
    return x if x.dtype.itemsize >= 4 and x.dtype.is_floating_point else x.float()


@dataclass(frozen=True)
class Norm:
    """A norm read from its module: y = γ ⊙ (x − mean x) / √(var x + eps) + β (centred: LayerNorm), or
    y = γ ⊙ x / √(mean x² + eps) + β (RMSNorm, β = 0). γ includes Gemma's 1 +."""

    name: str  # its path, for notes
    module: Any
    centred: bool
    gamma: Any  # (d,) float32
    beta: Any  # (d,) float32
    eps: float

    @property
    def kind(self) -> str:
        return "LayerNorm" if self.centred else "RMSNorm"

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """(…,) the per-token denominator σ the norm divides x (…, d) by, in float32 (or x's float64)."""
        x = at_least_float32(x)
        if self.centred:
            return (x.var(dim=-1, unbiased=False) + self.eps).sqrt()
        return (x.pow(2).mean(dim=-1) + self.eps).sqrt()

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        """n(x) (…, d): the norm without its γ and β."""
        x = at_least_float32(x)
        if self.centred:
            x = x - x.mean(dim=-1, keepdim=True)
        return x / self.scale(x)[..., None]

    def centre(self, v: torch.Tensor) -> torch.Tensor:
        """C v: the centring (I − 11ᵀ/d) a LayerNorm applies (symmetric, so the same on a reading direction); an
        RMSNorm's is the identity."""
        return v - v.mean(dim=-1, keepdim=True) if self.centred else v

    def jvp(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """J(x) t (…, d), float32: how the norm's output at x moves along t (x broadcastable to t). With n = n(x)
        and σ its denominator, J t = γ ⊙ (C t − n (n · C t) / d) / σ (the same form for both norms)."""
        x, t = at_least_float32(x), self.centre(at_least_float32(t))
        n, sigma = self.normalise(x), self.scale(x)[..., None]
        d = x.shape[-1]
        return self.gamma.to(t.device) * (t - n * (n * t).sum(-1, keepdim=True) / d) / sigma

    def statistics(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(n(x) (…, d), σ (…, 1)): what `vjp` needs of x, to compute once for several gradients at the same x."""
        x = at_least_float32(x)
        return self.normalise(x), self.scale(x)[..., None]

    def vjp(self, x: torch.Tensor, g: torch.Tensor, statistics: tuple | None = None) -> torch.Tensor:
        """J(x)ᵀ g (…, d), float32: the gradient at the norm's input from the gradient g at its output (x
        broadcastable to g): C (u − n (n · u) / d) / σ with u = γ ⊙ g; `statistics`: x's, already computed."""
        import torch

        u = self.gamma.to(g.device) * at_least_float32(g)  # a new tensor: the steps below work in place
        n, sigma = self.statistics(x) if statistics is None else statistics
        u.addcmul_(n, torch.linalg.vecdot(n, u)[..., None], value=-1.0 / n.shape[-1])
        if self.centred:
            u.sub_(u.mean(dim=-1, keepdim=True))
        return u.div_(sigma)


def read_norm(module: Any, name: str, offset: float = 0.0) -> Norm | None:
    """The norm of `module` (None for nn.Identity): RMSNorm when its class says so, else LayerNorm (torch's, OLMo's
    without parameters, Cohere's without bias). `offset` is added to γ (Gemma's 1 + γ)."""
    import torch

    class_name = type(module).__name__
    if class_name == "Identity":
        return None
    rms = class_name.endswith("RMSNorm")
    if not rms and not class_name.endswith("LayerNorm"):
        raise AttnscopeError(f"cannot read the norm {name} ({class_name}): neither a LayerNorm nor an RMSNorm")
    weight = getattr(module, "weight", None)
    bias = getattr(module, "bias", None)
    size = _norm_size(module, weight)
    gamma = torch.ones(size) if weight is None else weight.detach().float().cpu() + (offset if rms else 0.0)
    beta = torch.zeros(size) if bias is None else bias.detach().float().cpu()
    # OLMo's LayerNorm has no parameters and calls F.layer_norm with eps 1e-5 fixed
    eps = getattr(module, "eps", None) or getattr(module, "variance_epsilon", None) or 1e-5
    return Norm(name, module, not rms, gamma, beta, float(eps))


def _norm_size(module: Any, weight: Any) -> int:
    if weight is not None:
        return weight.numel()
    shape = module.normalized_shape
    return int(shape[-1] if isinstance(shape, tuple | list) else shape)
