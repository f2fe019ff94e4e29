"""fuse_attention on transformers' default (SDPA) attention as both exporters write it: BERT-base and MiniLM
structures at a small width, built with a fixed-shape profile, have every attention block as one
FusedAttention layer and agree with ONNX Runtime at fp32 rtol 1e-4 / atol 1e-5."""

from __future__ import annotations

import collections

import numpy as np
import onnxruntime as ort
import pytest
import torch

import kiln
from models.export import export
from models.text import LastHidden

S, VOCAB = 16, 500
INPUTS, OUTPUTS = ["input_ids", "attention_mask", "token_type_ids"], ["last_hidden_state", "pooler_output"]
ENCODERS = {"bert": dict(hidden_size=64, num_attention_heads=4), "minilm": dict(hidden_size=96, num_attention_heads=6)}


def _encoder(cfg: dict) -> torch.nn.Module:
    """A BertModel with the default attention implementation (SDPA), 2 layers, random weights."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, num_hidden_layers=2, intermediate_size=4 * cfg["hidden_size"],
                        max_position_embeddings=64, **cfg)
    model = BertModel(config)
    assert model.config._attn_implementation == "sdpa"
    return LastHidden(model).eval()


def _inputs(seed: int, all_padding: bool) -> dict[str, torch.Tensor]:
    """Two sequences: the first half padding, the second none or all padding (its scores fully masked)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, S), generator=g)
    mask = torch.ones_like(ids)
    mask[0, S // 2:] = 0
    mask[1] = int(not all_padding)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("name", list(ENCODERS))
def test_every_attention_block_fused(name, dynamo, tmp_path):
    trace = _inputs(0, all_padding=False)  # a padded trace sample keeps the mask path
    path = export(_encoder(ENCODERS[name]), tuple(trace.values()), tmp_path / f"{name}.onnx", dynamo=dynamo,
                  input_names=INPUTS, output_names=OUTPUTS, dynamic_axes={n: {0: "batch"} for n in INPUTS + OUTPUTS})
    engine = kiln.build(str(path), kiln.BuildConfig.with_shapes({n: (2, S) for n in INPUTS}, device="cpu"))
    kinds = collections.Counter(layer.kind for layer in engine.network.layers)
    assert kinds["FusedAttention"] == 2 and not {"Softmax", "MatMul", "IsNaN"} & set(kinds), kinds
    assert all(l.attrs["nan_to_zero"] for l in engine.network.layers if l.kind == "FusedAttention")
    feeds = {k: v.numpy() for k, v in _inputs(1, all_padding=True).items()}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(OUTPUTS, feeds)
    got = engine.run(feeds)
    for out, w in zip(OUTPUTS, want):
        np.testing.assert_allclose(got[out], w, rtol=1e-4, atol=1e-5, err_msg=out)
