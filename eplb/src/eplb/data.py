"""Built-in synthetic load: skewed (Zipf-like) expert popularity, as MoE routers produce."""
import torch


def zipf_load(num_layers: int = 58, num_experts: int = 256, s: float = 1.0,
              tokens: int = 1_000_000, noise: float = 0.3, seed: int = 0) -> torch.Tensor:
    """Token counts per expert: rank r gets ~ r**-s, ranks shuffled per layer, log-normal noise.

    Returns [num_layers, num_experts] int64, each row summing to about ``tokens``.
    """
    g = torch.Generator().manual_seed(seed)
    rank = torch.rand(num_layers, num_experts, generator=g).argsort(-1).double() + 1
    w = rank.pow(-s) * torch.exp(noise * torch.randn(num_layers, num_experts, generator=g,
                                                     dtype=torch.float64))
    return (w / w.sum(-1, keepdim=True) * tokens).round().long()


def batch_tokens(load: torch.Tensor, batch: int = 16384, seed: int = 1) -> torch.Tensor:
    """One batch routed by the popularity ``load`` [L, E]: [L, E] int64 token counts."""
    g = torch.Generator().manual_seed(seed)
    picks = torch.multinomial(load.double() + 1e-9, batch, replacement=True, generator=g)
    return torch.zeros_like(load, dtype=torch.long).scatter_add_(1, picks, torch.ones_like(picks))
