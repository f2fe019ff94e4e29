"""INT8 accuracy on real data (CPU): a CNN trained here on scikit-learn's digits, and all-MiniLM-L6-v2's real weights.

Thresholds: digits INT8 top-1 within 1 point of fp32 on 597 held-out images; MiniLM sentence embeddings
(mean pooling, L2-normalized) of 300 held-out sentences with SmoothQuant: every cosine INT8 vs fp32 ≥ 0.995 and
the nearest neighbour unchanged for ≥ 98 % of them (issue 27).
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


# templated English sentences (seeded): a second, varied source besides numpy's docstrings
_SUBJECTS = ["The committee", "My grandmother", "A young engineer", "The old fisherman", "Our neighbour's cat",
             "The city council", "A famous violinist", "The hospital staff", "Two curious children",
             "The software team", "A retired pilot", "The local bakery", "Every student in the class",
             "The night nurse", "A stray dog", "The museum curator", "The football coach", "A quiet librarian",
             "The startup founder", "Her younger brother"]
_VERBS = ["decided to postpone", "quietly finished", "argued about", "carefully repaired", "forgot about",
          "celebrated", "complained loudly about", "spent all afternoon on", "was surprised by", "refused to discuss",
          "wrote a long report on", "took photographs of", "donated money to", "accidentally broke",
          "carefully studied"]
_OBJECTS = ["the annual budget", "an antique wooden clock", "the broken heating system", "a new vegetarian recipe",
            "the election results", "the flooded basement", "a rare species of orchid", "the delayed train schedule",
            "the quarterly sales figures", "a mysterious letter", "the village festival", "the server outage",
            "a collection of old maps", "the school playground", "the lunar eclipse", "a leaking roof"]
_TAILS = ["last Tuesday", "before the storm arrived", "despite the heavy rain", "after a long meeting",
          "in the early morning", "without telling anyone", "for the third time this year",
          "while the others were asleep", "during the holidays", "with great enthusiasm", "near the river",
          "at the end of the month"]
_QUESTIONS = ["How do I {v} {o}?", "Why is {o} so expensive these days?", "Where can I find {o} near the station?",
              "Is it safe to {v} {o} at home?", "What is the best way to {v} {o}?"]
_Q_VERBS = ["clean", "install", "replace", "measure", "paint", "cook", "photograph", "recycle", "store", "insure"]
_Q_OBJECTS = ["a cast iron pan", "solar panels", "a bicycle chain", "the kitchen sink", "a garden fence",
              "winter tyres", "an electric kettle", "old batteries", "a wooden floor", "fresh basil",
              "a laptop battery", "the car's brakes"]


def _templated(n: int, seed: int) -> list[str]:
    """`n` distinct sentences: statements (subject, verb, object, time or manner) and how-to questions, sorted."""
    rng, out = np.random.default_rng(seed), set()
    while len(out) < n:
        if rng.random() < 0.7:
            out.add(f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}.")
        else:
            out.add(str(rng.choice(_QUESTIONS)).format(v=rng.choice(_Q_VERBS), o=rng.choice(_Q_OBJECTS)))
    return sorted(out)


def _export(tmp_path):
    """Real all-MiniLM-L6-v2 weights exported at sequence 16 with a dynamic batch, and its tokenizer as `encode`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from models.text import LastHidden, minilm

    model, tok = minilm()
    names = ["input_ids", "attention_mask", "token_type_ids"]

    def encode(texts):
        enc = tok(texts, padding="max_length", truncation=True, max_length=16, return_tensors="np")
        return {n: enc[n].astype(np.int64) for n in names}

    args = tuple(torch.from_numpy(v) for v in encode(["A first sentence.", "A second one."]).values())
    path = export(LastHidden(model, pooled=False), args, tmp_path / "minilm.onnx", dynamo=False, input_names=names,
                  output_names=["last_hidden_state"], dynamic_axes={n: {0: "batch"} for n in names})
    return path, encode


def minilm_export(tmp_path):
    """`_export`, and numpy's docstring sentences split into calibration (~185) and held-out (~46) sets."""
    sentences = _sentences()
    held_out, calib = sentences[1::5], [s for i, s in enumerate(sentences) if i % 5 != 1]
    return (*_export(tmp_path), calib, held_out)


def _embed(engine, feeds):
    """Mean pooling over the real tokens, L2-normalized (sentence-transformers' recipe for this model)."""
    h = engine.run(feeds)["last_hidden_state"]
    mask = feeds["attention_mask"][..., None].astype(np.float32)
    e = (h * mask).sum(1) / mask.sum(1)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def _nearest(e):
    """Each sentence's nearest other sentence by cosine."""
    sim = e @ e.T
    np.fill_diagonal(sim, -np.inf)
    return sim.argmax(1)


DOWN = "/model/encoder/layer.{}/output/dense/MatMul"


@pytest.mark.skipif(len(_sentences()) < 200, reason="numpy has no docstrings (python -OO)")
def test_minilm_real_weights_int8_embeddings_match_fp32(tmp_path):
    """Issue 27's bar on 300 sentences (112 numpy docstring summaries + 188 templated ones), calibrated on 212
    others (the other 112 summaries + 100 templated): SmoothQuant (α 0.8, minmax) and the FFN down projections of
    layers 0-2 in fp32 (21 of 24 GEMMs int8): every sentence's cosine vs fp32 ≥ 0.995 (measured min 0.9983, mean
    0.9990) and the nearest neighbour unchanged for ≥ 98 % (measured 98.7 %). All 24 int8 with smoothing: min 0.9962,
    mean 0.9978, nearest neighbour 97.3 %. Before smoothing (percentile, the 6 down projections fp32): min 0.9892,
    mean 0.9941, 95.7 %; all 24 int8: min 0.9826, 92.3 %."""
    path, encode = _export(tmp_path)
    numpy_sentences = _sentences()
    calib = numpy_sentences[0::2] + _templated(300, seed=1)[:100]
    evaluated = [s for s in numpy_sentences[1::2] + _templated(400, seed=2) if s not in set(calib)][:300]
    assert len(evaluated) == 300 and len(set(evaluated)) == 300 and not set(calib) & set(evaluated)
    feeds = encode(evaluated)
    fp32 = _embed(kiln.build(path, kiln.BuildConfig(device="cpu")), feeds)

    def int8(pinned: dict[str, str]):
        eng = kiln.build(path, kiln.BuildConfig(device="cpu", int8=True, calibrator="minmax", smooth_alpha=0.8,
                                                layer_precisions=pinned),
                         calib_data=(encode(calib[i:i + 32]) for i in range(0, len(calib), 32)))
        assert "SmoothQuant (alpha 0.8)" in eng.build_info["int8"]["scales_from"]
        e = _embed(eng, feeds)
        return eng.build_info["int8"]["layers"], (fp32 * e).sum(1), float((_nearest(fp32) == _nearest(e)).mean())

    # the FFN down projections of the first layers read GELU outputs whose outliers come on a few tokens only:
    # per-channel smoothing cannot flatten them, so they stay float (as a TensorRT user pins them)
    pinned = {DOWN.format(i): "fp32" for i in range(3)}
    layers, cos, same = int8(pinned)
    assert len(layers) == 24 and sum(r["precision"] == "int8" for r in layers.values()) == 21
    assert all(layers[n]["reason"] == "kept in float on request" for n in pinned)
    assert cos.min() >= 0.995 and cos.mean() >= 0.998 and same >= 0.98, (cos.min(), cos.mean(), same)
    layers, cos, same = int8({})
    assert sum(r["precision"] == "int8" for r in layers.values()) == 24
    assert cos.min() >= 0.995 and cos.mean() >= 0.997 and same >= 0.96, (cos.min(), cos.mean(), same)
