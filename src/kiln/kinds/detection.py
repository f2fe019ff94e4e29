"""Reference implementation of NonMaxSuppression (greedy, per batch and class, as ONNX defines it)."""

from __future__ import annotations

import torch

from kiln.kinds.registry import INT, kind


def _corners(boxes: torch.Tensor, center_point_box: int) -> torch.Tensor:
    """[..., 4] boxes → (x1, y1, x2, y2) with x1 <= x2 and y1 <= y2."""
    if center_point_box:
        xy, half = boxes[..., :2], boxes[..., 2:] / 2
        return torch.cat([xy - half, xy + half], -1)
    y1, x1, y2, x2 = boxes.unbind(-1)
    return torch.stack([torch.minimum(x1, x2), torch.minimum(y1, y2), torch.maximum(x1, x2), torch.maximum(y1, y2)], -1)


def _overlaps(c: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """[n, n] bool: IoU of box i and box j is strictly above the threshold (degenerate boxes never are)."""
    lo = torch.maximum(c[:, None, :2], c[None, :, :2])
    hi = torch.minimum(c[:, None, 2:], c[None, :, 2:])
    wh = hi - lo
    inter = wh[..., 0] * wh[..., 1]
    area = (c[:, 2] - c[:, 0]) * (c[:, 3] - c[:, 1])
    union = area[:, None] + area[None, :] - inter
    valid = (wh > 0).all(-1) & (area[:, None] > 0) & (area[None, :] > 0) & (union > 0)
    return valid & (inter / union.where(valid, torch.ones_like(union)) > iou_threshold)


@kind("NonMaxSuppression", attrs={"center_point_box": INT.req})
def non_max_suppression(inputs, attrs):
    """inputs: boxes [B, N, 4], scores [B, C, N], max_output_boxes_per_class?, iou_threshold?,
    score_threshold? → selected [K, 3] rows of (batch, class, box)."""
    boxes, scores, max_out, iou, score_thr = (list(inputs) + [None] * 3)[:5]
    limit = max(int(max_out.reshape(-1)[0]), 0) if max_out is not None and max_out.numel() else 0
    iou = float(iou.reshape(-1)[0]) if iou is not None and iou.numel() else 0.0
    corners = _corners(boxes if boxes.dtype == torch.float64 else boxes.float(), attrs["center_point_box"])
    selected = []
    for b in range(boxes.shape[0]):
        overlaps = _overlaps(corners[b], iou).tolist()
        for c in range(scores.shape[1]):
            s = scores[b, c]
            order = torch.sort(s, descending=True, stable=True).indices
            if score_thr is not None and score_thr.numel():
                order = order[s[order] > score_thr.reshape(-1)[0]]
            kept: list[int] = []
            for i in order.tolist():
                if len(kept) >= limit:
                    break
                if not any(overlaps[i][k] for k in kept):
                    kept.append(i)
            selected += [(b, c, i) for i in kept]
    return torch.tensor(selected, dtype=torch.int64, device=boxes.device).reshape(-1, 3)
