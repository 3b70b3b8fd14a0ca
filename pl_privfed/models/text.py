"""A small text classifier (plain ``nn.Module``): token embeddings, LayerNorm, a position-wise
feed-forward layer over the sequence, mean pooling and a linear classifier."""

from __future__ import annotations

from torch import Tensor, nn

from pl_privfed.checks import check_positive_int

__all__ = ["TextClassifier"]


class TextClassifier(nn.Module):
    """``tokens [B, T] → logits [B, num_classes]``.

    ``Embedding(vocab, dim, padding_idx)`` → ``LayerNorm(dim)`` → ``Linear(dim, hidden)`` and
    ReLU at every position → mean over the ``T`` positions → ``Linear(hidden, num_classes)``.
    The layers whose per-example gradients the layer rules cover (``grad_backend: layers``):
    an embedding, a norm and a ``Linear`` over sequences.

    Args:
        vocab_size: tokens in the vocabulary.
        dim: embedding width.
        hidden: width of the position-wise layer.
        num_classes: logits.
        padding_idx: the padding token (its embedding gets no gradient), or ``None``.

    >>> import torch
    >>> TextClassifier(100, 16, 32, 4)(torch.randint(0, 100, (5, 12))).shape
    torch.Size([5, 4])
    """

    def __init__(
        self,
        vocab_size: int = 10_000,
        dim: int = 64,
        hidden: int = 128,
        num_classes: int = 2,
        padding_idx: int | None = 0,
    ) -> None:
        super().__init__()
        for name, value in [
            ("vocab_size", vocab_size),
            ("dim", dim),
            ("hidden", hidden),
            ("num_classes", num_classes),
        ]:
            check_positive_int(name, value)
        if padding_idx is not None and not 0 <= padding_idx < vocab_size:
            raise ValueError(f"padding_idx must be in [0, {vocab_size}), got {padding_idx!r}")
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=padding_idx)
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Linear(dim, hidden)
        self.act = nn.ReLU()
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, tokens: Tensor) -> Tensor:
        h = self.act(self.ff(self.norm(self.embed(tokens.long()))))
        return self.head(h.mean(1))
