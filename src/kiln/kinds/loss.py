"""Reference implementations of NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Attributes: `reduction` ("none", "sum" or "mean") and `ignore_index` (None when absent). A target
equal to `ignore_index` contributes nothing, and a "mean" divides by the total weight of the
targets that are not ignored.
"""

from __future__ import annotations

import torch

from kiln.kinds.registry import INT, NONE, STR, kind
from kiln.kinds.normalization import compute_dtype


def nll(log_prob: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, attrs: dict) -> torch.Tensor:
    """-log_prob[n, target[n, ...], ...] weighted per class, reduced as `reduction` says."""
    ignore = attrs.get("ignore_index")
    ignored = target == ignore if ignore is not None else torch.zeros_like(target, dtype=torch.bool)
    safe = torch.where(ignored, 0, target).long()
    picked = -log_prob.gather(1, safe.unsqueeze(1)).squeeze(1)
    w = weight.to(log_prob.dtype)[safe] if weight is not None else torch.ones_like(picked)
    w = torch.where(ignored, 0, w)
    loss = picked * w
    reduction = attrs.get("reduction", "mean")
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / w.sum()
    return loss


@kind("NegativeLogLikelihoodLoss", attrs={"ignore_index": INT | NONE, "reduction": STR})
def negative_log_likelihood_loss(inputs, attrs):
    x, target, weight = (list(inputs) + [None])[:3]
    return nll(x.to(compute_dtype(x)), target, weight, attrs).to(x.dtype)


@kind("SoftmaxCrossEntropyLoss", attrs={"ignore_index": INT | NONE, "reduction": STR})
def softmax_cross_entropy_loss(inputs, attrs):
    """Returns the loss and the log-probabilities (log_softmax over the class dim 1)."""
    scores, labels, weights = (list(inputs) + [None])[:3]
    log_prob = torch.log_softmax(scores.to(compute_dtype(scores)), dim=1)
    return nll(log_prob, labels, weights, attrs).to(scores.dtype), log_prob.to(scores.dtype)
