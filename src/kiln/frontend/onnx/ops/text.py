"""ONNX importer for TfIdfVectorizer (integer or string n-gram pools)."""

from __future__ import annotations

from kiln.errors import ModelError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, register


@register("TfIdfVectorizer", since=9)
def tfidf_vectorizer(node: OnnxNode, ctx: ImportContext) -> None:
    a = node.attrs
    pools = [p for p in (a.get("pool_int64s"), a.get("pool_strings")) if p]
    if len(pools) != 1:
        raise ModelError(f"{node.where()}: exactly one of pool_int64s and pool_strings must be set")
    if a.get("mode") not in ("TF", "IDF", "TFIDF"):
        raise ModelError(f"{node.where()}: mode must be TF, IDF or TFIDF, got {a.get('mode')!r}")
    bounds = list(a["ngram_counts"]) + [len(pools[0])]
    for size, (start, end) in enumerate(zip(bounds, bounds[1:]), start=1):
        if (end - start) % size:
            raise ModelError(f"{node.where()}: pool items {start}..{end} do not make whole {size}-grams")
    attrs = {k: a[k] for k in ("mode", "min_gram_length", "max_gram_length", "max_skip_count",
                               "ngram_counts", "ngram_indexes")}
    attrs.update(pool=pools[0], weights=a.get("weights", []))
    ctx.emit(node, "TfIdfVectorizer", node.inputs, node.outputs, attrs)
