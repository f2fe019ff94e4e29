"""INT8 accuracy on real data (CPU): a CNN trained here on scikit-learn's digits, and all-MiniLM-L6-v2's real weights.

Thresholds: digits INT8 top-1 within 1 point of fp32 on 597 held-out images; MiniLM sentence embeddings
(mean pooling, L2-normalized) of held-out sentences: mean cosine INT8 vs fp32 ≥ 0.99.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import kiln
from models.export import export


def _digits_model(x, y):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                            torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 10))
    opt = torch.optim.Adam(m.parameters(), 3e-3)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(8):
        for i in torch.randperm(len(xt)).split(64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(xt[i]), yt[i]).backward()
            opt.step()
    return m.eval()


def test_digits_cnn_int8_top1_within_one_point_of_fp32(tmp_path):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    y = d.target.astype(np.int64)
    train, test = slice(0, 1200), slice(1200, None)
    m = _digits_model(x[train], y[train])
    path = export(m, (torch.from_numpy(x[:2]),), tmp_path / "digits.onnx", dynamo=False, input_names=["x"],
                  output_names=["logits"], dynamic_axes={"x": {0: "b"}})
    np.savez(tmp_path / "calib.npz", x=x[:256])
    fp32 = kiln.build(path, kiln.BuildConfig(device="cpu"))
    # entropy clips these images too hard (their pixels take 17 values: a sparse histogram); mse keeps the range
    int8 = kiln.build(path, kiln.BuildConfig(device="cpu", int8=True, calib=str(tmp_path / "calib.npz"),
                                             calibrator="mse"))
    assert len(int8.build_info["int8"]["layers"]) == 4
    assert all(r["precision"] == "int8" for r in int8.build_info["int8"]["layers"].values())
    top1 = {name: float((e.run({"x": x[test]})["logits"].argmax(1) == y[test]).mean() * 100)
            for name, e in (("fp32", fp32), ("int8", int8))}
    assert top1["fp32"] > 90, top1      # the model learned something
    assert abs(top1["int8"] - top1["fp32"]) <= 1.0, top1


def _sentences() -> list[str]:
    """Real English sentences: the one-line summaries of numpy's documented functions, deduplicated and sorted."""
    seen = set()
    for name in sorted(dir(np)):
        doc = getattr(getattr(np, name), "__doc__", None)
        if not isinstance(doc, str) or not callable(getattr(np, name)):
            continue
        line = next((ln.strip() for ln in doc.strip().splitlines() if ln.strip()), "")
        if 25 <= len(line) <= 120 and line[0].isupper() and line.endswith(".") and "(" not in line:
            seen.add(line)
    return sorted(seen)


def minilm_export(tmp_path):
    """Real all-MiniLM-L6-v2 weights exported at sequence 16 with a dynamic batch, the tokenizer as `encode`, and
    numpy's docstring sentences split into calibration (~185) and held-out (~46) sets."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from models.text import LastHidden, minilm

    sentences = _sentences()
    held_out, calib = sentences[1::5], [s for i, s in enumerate(sentences) if i % 5 != 1]
    model, tok = minilm()
    names = ["input_ids", "attention_mask", "token_type_ids"]

    def encode(texts):
        enc = tok(texts, padding="max_length", truncation=True, max_length=16, return_tensors="np")
        return {n: enc[n].astype(np.int64) for n in names}

    args = tuple(torch.from_numpy(v) for v in encode(calib[:2]).values())
    path = export(LastHidden(model, pooled=False), args, tmp_path / "minilm.onnx", dynamo=False, input_names=names,
                  output_names=["last_hidden_state"], dynamic_axes={n: {0: "batch"} for n in names})
    return path, encode, calib, held_out


@pytest.mark.skipif(not _sentences(), reason="numpy has no docstrings (python -OO)")
def test_minilm_real_weights_int8_embeddings_match_fp32(tmp_path):
    assert len(_sentences()) >= 200, len(_sentences())
    path, encode, calib, held_out = minilm_export(tmp_path)
    fp32 = kiln.build(path, kiln.BuildConfig(device="cpu"))
    # the FFN down projections read GELU outputs with outliers: kept in fp32 (the sensitive layers a user pins
    # with --layer-precision NAME=fp32, as TensorRT users do); all 24 int8 gives mean cosine ≈ 0.990 here
    down = {f"/model/encoder/layer.{i}/output/dense/MatMul": "fp32" for i in range(6)}
    int8 = kiln.build(path, kiln.BuildConfig(device="cpu", int8=True, calibrator="percentile", layer_precisions=down),
                      calib_data=(encode(calib[i:i + 32]) for i in range(0, len(calib), 32)))
    layers = int8.build_info["int8"]["layers"]
    # 6 × (merged q/k/v, attention output, up, down projections): all int8 but the 6 pinned
    assert len(layers) == 24 and sum(r["precision"] == "int8" for r in layers.values()) == 18
    assert all(layers[n]["reason"] == "kept in float on request" for n in down)

    def embed(engine, feeds):
        h = engine.run(feeds)["last_hidden_state"]
        mask = feeds["attention_mask"][..., None].astype(np.float32)
        e = (h * mask).sum(1) / mask.sum(1)
        return e / np.linalg.norm(e, axis=1, keepdims=True)

    feeds = encode(held_out)
    cos = (embed(fp32, feeds) * embed(int8, feeds)).sum(1)
    assert cos.mean() >= 0.99 and cos.min() >= 0.95, (cos.mean(), cos.min())
