"""TfIdfVectorizer against ONNX Runtime on random token sequences over a small vocabulary."""

import numpy as np
import pytest

import kiln
from kiln.errors import ModelError
from opcheck import DEVICE, check_op, make_model

rng = np.random.default_rng(0)

# 4 unigrams, 3 bigrams, 2 trigrams; a vocabulary of 6 tokens makes many of them occur
POOL = [1, 2, 3, 4, 1, 2, 2, 3, 5, 1, 1, 2, 3, 2, 3, 4]
COUNTS = [0, 4, 10]
WEIGHTS = [0.5, 1.5, 2.0, 0.25, 3.0, 1.0, 0.75, 2.5, 4.0]


def attrs(mode="TF", lo=1, hi=3, skip=2, strings=False):
    pool = {"pool_strings": [f"t{v}" for v in POOL]} if strings else {"pool_int64s": POOL}
    return {"mode": mode, "min_gram_length": lo, "max_gram_length": hi, "max_skip_count": skip,
            "ngram_counts": COUNTS, "ngram_indexes": [8, 0, 1, 7, 2, 3, 6, 4, 5], "weights": WEIGHTS, **pool}


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("shape", [(20,), (3, 12)])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_tfidf_ints(mode, shape, dtype):
    check_op("TfIdfVectorizer", {"x": rng.integers(0, 6, shape).astype(dtype)}, attrs(mode), opset=9)


@pytest.mark.parametrize("lo, hi, skip", [(1, 1, 0), (2, 2, 0), (2, 3, 3), (1, 2, 5)])
def test_tfidf_gram_lengths_and_skips(lo, hi, skip):
    check_op("TfIdfVectorizer", {"x": rng.integers(0, 6, (2, 15)).astype(np.int64)}, attrs("TF", lo, hi, skip),
             opset=9)


def test_tfidf_strings():
    x = np.array([f"t{v}" for v in rng.integers(0, 6, 24)], dtype=object).reshape(2, 12)
    check_op("TfIdfVectorizer", {"x": x}, attrs("TFIDF", strings=True), opset=9)


def test_tfidf_rejects_two_pools():
    a = attrs() | {"pool_strings": ["a"] * len(POOL)}
    model = make_model("TfIdfVectorizer", {"x": np.zeros(4, np.int64)}, a, opset=9)
    with pytest.raises(ModelError, match="exactly one of pool_int64s and pool_strings"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))


def test_tfidf_rejects_partial_ngrams():
    a = attrs() | {"pool_int64s": POOL[:-1]}
    model = make_model("TfIdfVectorizer", {"x": np.zeros(4, np.int64)}, a, opset=9)
    with pytest.raises(ModelError, match="do not make whole 3-grams"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))
