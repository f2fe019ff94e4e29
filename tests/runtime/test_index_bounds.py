"""Index inputs (embedding ids) are checked against the tables they index, whether a Gather or a fused embedding
lookup (EmbedLayerNorm) reads them: an id out of range is an InputError naming the input and its range, and
`kiln run`'s random inputs stay inside it (BERT's token types index a table of two rows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from kiln.cli.inputs import random_feeds
from kiln.errors import InputError
from kiln.runtime.io import index_bounds
from models.export import export
from models.text import LastHidden, tiny_bert

S = 16
NAMES = ["input_ids", "attention_mask", "token_type_ids"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny BERT (vocabulary 500, two token types) built fp16 on the CPU: its lookups fuse into EmbedLayerNorm."""
    ids = torch.randint(0, 500, (1, S), generator=torch.Generator().manual_seed(0))
    path = export(LastHidden(tiny_bert(layers=1)), (ids, torch.ones_like(ids), torch.zeros_like(ids)),
                  tmp_path_factory.mktemp("bounds") / "bert.onnx", dynamo=False, input_names=NAMES,
                  output_names=["last_hidden_state", "pooler_output"])
    engine = kiln.build(str(path), kiln.BuildConfig.with_shapes({n: (1, S) for n in NAMES}, device="cpu", fp16=True))
    assert "EmbedLayerNorm" in {l.kind for l in engine.network.layers}
    return engine


def _feeds(ids: int, types: int) -> dict[str, np.ndarray]:
    return {"input_ids": np.full((1, S), ids, np.int64), "attention_mask": np.ones((1, S), np.int64),
            "token_type_ids": np.full((1, S), types, np.int64)}


def test_the_fused_lookups_bound_their_ids(bert):
    bounds = index_bounds(bert.network)
    assert {k: rows for k, (rows, _) in bounds.items()} == {"input_ids": 500, "token_type_ids": 2}


@pytest.mark.parametrize("ids,types,bad", [(500, 0, "input_ids"), (3, 2, "token_type_ids"), (-501, 0, "input_ids")])
def test_an_id_out_of_range_is_the_callers_error(bert, ids, types, bad):
    with pytest.raises(InputError, match=rf"input '{bad}': values must be in \[-\d+, \d+\)"):
        bert.create_context().run(_feeds(ids, types))


def test_ids_in_range_run_and_random_inputs_stay_in_range(bert):
    ctx = bert.create_context()
    assert np.isfinite(ctx.run(_feeds(499, 1))["last_hidden_state"]).all()
    feeds = random_feeds(bert, {}, seed=0)
    assert feeds["token_type_ids"].max() < 2
    assert np.isfinite(ctx.run(feeds)["pooler_output"]).all()
