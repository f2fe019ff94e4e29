"""Reference implementation of TfIdfVectorizer: counts of pooled n-grams (with skips) per input row."""

from __future__ import annotations

import numpy as np
import torch

from kiln.kinds.registry import FLOATS, INT, INTS, STR, STRS, kind, list_of


def _ngram_table(attrs: dict) -> dict[tuple, int]:
    """Pooled n-grams of the wanted lengths → output column; the first of repeated n-grams wins."""
    pool, counts = attrs["pool"], attrs["ngram_counts"]
    table: dict[tuple, int] = {}
    ngram_id = 0
    for size, start in enumerate(counts, start=1):
        end = counts[size] if size < len(counts) else len(pool)
        for at in range(start, end - size + 1, size):
            if attrs["min_gram_length"] <= size <= attrs["max_gram_length"]:
                table.setdefault(tuple(pool[at:at + size]), attrs["ngram_indexes"][ngram_id])
            ngram_id += 1
    return table


def _count_row(row: list, table: dict[tuple, int], attrs: dict, counts: np.ndarray) -> None:
    """Add the row's n-gram hits to `counts`; unigrams are counted once, longer n-grams per skip distance."""
    lo, hi = attrs["min_gram_length"], attrs["max_gram_length"]
    for skip in range(1, attrs["max_skip_count"] + 2):
        for size in range(max(lo, 1 if skip == 1 else 2), hi + 1):
            for start in range(len(row) - (size - 1) * skip):
                column = table.get(tuple(row[start:start + (size - 1) * skip + 1:skip]))
                if column is not None:
                    counts[column] += 1


@kind("TfIdfVectorizer", attrs={"max_gram_length": INT.req, "max_skip_count": INT.req, "min_gram_length": INT.req,
                                "mode": STR.req, "ngram_counts": INTS.req, "ngram_indexes": INTS.req,
                                "pool": list_of(INT | STR).req, "pool_int64s": INTS, "pool_strings": STRS,
                                "weights": FLOATS.req})
def tfidf_vectorizer(inputs, attrs):
    """X [C] or [N, C] (integers, or strings as a numpy object array) → float32 [width] or [N, width]."""
    x = inputs[0]
    rows = x.tolist() if x.ndim else [x.tolist()]
    batched = x.ndim == 2
    width = max(attrs["ngram_indexes"]) + 1
    table = _ngram_table(attrs)
    counts = np.zeros((len(rows) if batched else 1, width), dtype=np.float32)
    for r, row in enumerate(rows if batched else [rows]):
        _count_row(row, table, attrs, counts[r])
    weights = np.ones(width, dtype=np.float32)  # the i-th weight scales the i-th pooled n-gram's column
    if attrs["weights"]:
        weights[attrs["ngram_indexes"]] = attrs["weights"]
    if attrs["mode"] == "IDF":
        counts = (counts > 0) * weights
    elif attrs["mode"] == "TFIDF":
        counts = counts * weights
    out = torch.from_numpy(np.ascontiguousarray(counts, dtype=np.float32))
    return (out if batched else out[0]).to(getattr(x, "device", "cpu"))
