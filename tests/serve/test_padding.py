"""Dynamic batching with padding (issue 24 part 3): requests whose inputs differ only along the padded axis are merged,
right-padded with each input's pad value (the attention mask with 0), and the outputs that follow the padded length are
cut back to each request's own length.

The model is a one-layer masked self-attention built in the test: input_ids, attention_mask int64[batch, seq] →
embeddings (a gather: exact), last_hidden_state (softmax(q kᵀ/√d + mask bias) v) float32[batch, seq, 8] and pooled (the
masked mean of last_hidden_state) float32[batch, 8]. Padded key positions get a -1e9 bias, so their softmax weight is
exactly 0 in float32; the padded batch still sums over more (zero) terms in a possibly different order, so the
attention outputs are compared at float32 tolerance (rtol 1e-5, atol 1e-6), the gather exactly."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_http import serving

import kiln
from kiln.errors import ConfigError, InputError
from kiln.serve import DynamicBatcher, ModelConfig
from kiln.serve.config import Padding
from kiln.serve.errors import BadRequest

HIDDEN, VOCAB, MAX_SEQ, MAX_BATCH = 8, 50, 16, 8
PROFILES = ('[[profiles]]\n'
            f'input_ids = {{min = [1, 1], opt = [4, 8], max = [{MAX_BATCH}, {MAX_SEQ}]}}\n'
            f'attention_mask = {{min = [1, 1], opt = [4, 8], max = [{MAX_BATCH}, {MAX_SEQ}]}}\n')
PADDING = ('[dynamic_batching.padding]\naxis = 1\ninputs = { input_ids = 0, attention_mask = 0 }\n'
           'outputs = ["embeddings", "last_hidden_state"]\n')
RTOL, ATOL = 1e-5, 1e-6  # float32 softmax / matmul / mean over a few extra exact-zero terms


def masked_attention_onnx() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    init = [numpy_helper.from_array(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32), "E")]
    for n in ("Wq", "Wk", "Wv"):
        init.append(numpy_helper.from_array((rng.standard_normal((HIDDEN, HIDDEN)) / HIDDEN ** 0.5)
                                            .astype(np.float32), n))
    init += [numpy_helper.from_array(np.array(1 / HIDDEN ** 0.5, np.float32), "scale"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(-1e9, np.float32), "neg"),
             numpy_helper.from_array(np.array([1], np.int64), "ax1"),
             numpy_helper.from_array(np.array([-1], np.int64), "axm1")]
    n = helper.make_node
    nodes = [n("Gather", ["E", "input_ids"], ["embeddings"]),
             n("MatMul", ["embeddings", "Wq"], ["q"]), n("MatMul", ["embeddings", "Wk"], ["k"]),
             n("MatMul", ["embeddings", "Wv"], ["v"]),
             n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), n("MatMul", ["q", "kt"], ["s0"]),
             n("Mul", ["s0", "scale"], ["s1"]),
             n("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
             n("Sub", ["one", "mf"], ["inv"]), n("Mul", ["inv", "neg"], ["bias0"]),
             n("Unsqueeze", ["bias0", "ax1"], ["bias"]), n("Add", ["s1", "bias"], ["s2"]),
             n("Softmax", ["s2"], ["p"], axis=-1), n("MatMul", ["p", "v"], ["last_hidden_state"]),
             n("Unsqueeze", ["mf", "axm1"], ["m3"]), n("Mul", ["last_hidden_state", "m3"], ["masked"]),
             n("ReduceSum", ["masked", "ax1"], ["total"], keepdims=0),
             n("ReduceSum", ["m3", "ax1"], ["count"], keepdims=0), n("Div", ["total", "count"], ["pooled"])]
    ins = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "seq"])
           for name in ("input_ids", "attention_mask")]
    outs = [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", "seq", HIDDEN]),
            helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", HIDDEN]),
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", HIDDEN])]
    graph = helper.make_graph(nodes, "masked_attention", ins, outs, init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def tokens(rows: int, length: int, seed: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(1, VOCAB, (rows, length), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


# ---------------------------------------------------------------- config validation


@pytest.fixture(scope="module")
def engine():
    profile = {n: ((1, 1), (4, 8), (MAX_BATCH, MAX_SEQ)) for n in ("input_ids", "attention_mask")}
    return kiln.build(masked_attention_onnx(), kiln.BuildConfig(device="cpu", profiles=(profile,)))


def _config(tmp_path: Path, text: str) -> ModelConfig:
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "m" / "config.toml").write_text(text)
    return ModelConfig.from_toml(tmp_path / "m" / "config.toml", tmp_path / "m")


def test_padding_config_parses_and_completes(tmp_path, engine):
    cfg = _config(tmp_path, f"max_batch_size = 8\n{PADDING}").complete(engine)
    assert cfg.dynamic_batching.padding == Padding(1, {"input_ids": 0, "attention_mask": 0},
                                                   ["embeddings", "last_hidden_state"])
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 0


@pytest.mark.parametrize("section, words", [
    ("axis = 0\ninputs = {input_ids = 0}", ["axis", ">= 1", "batch"]),
    ("axis = \"1\"\ninputs = {input_ids = 0}", ["axis"]),
    ("inputs = {input_ids = 0}", ["axis"]),
    ("axis = 1", ["inputs"]),
    ("axis = 1\ninputs = {}", ["inputs"]),
    ("axis = 1\ninputs = {input_ids = \"0\"}", ["inputs.input_ids", "pad value"]),
    ("axis = 1\ninputs = {input_ids = 0}\noutputs = \"pooled\"", ["outputs", "list"]),
    ("axis = 1\ninputs = {input_ids = 0}\nmask = \"attention_mask\"", ["unknown keys", "'mask'"]),
])
def test_padding_form_errors(tmp_path, section, words):
    with pytest.raises(ConfigError) as e:
        _config(tmp_path, f"max_batch_size = 8\n[dynamic_batching.padding]\n{section}\n")
    assert "[dynamic_batching.padding]" in str(e.value)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize("text, words", [
    ("max_batch_size = 8\n[dynamic_batching.padding]\naxis = 1\ninputs = {token_type_ids = 0}\n",
     ["inputs.token_type_ids", "no such input"]),
    ("max_batch_size = 8\n[dynamic_batching.padding]\naxis = 2\ninputs = {input_ids = 0}\n",
     ["inputs.input_ids", "axis 2", "dynamic"]),
    ("max_batch_size = 8\n[dynamic_batching.padding]\naxis = 1\ninputs = {input_ids = 0.5}\n",
     ["inputs.input_ids", "0.5", "INT64"]),
    ("max_batch_size = 8\n[dynamic_batching.padding]\naxis = 1\ninputs = {input_ids = 0}\noutputs = [\"logits\"]\n",
     ["outputs", "'logits'"]),
    ("max_batch_size = 8\n[dynamic_batching.padding]\naxis = 1\ninputs = {input_ids = 0}\noutputs = [\"pooled\"]\n",
     ["outputs", "'pooled'", "not dynamic"]),
    ("max_batch_size = 0\n[dynamic_batching.padding]\naxis = 1\ninputs = {input_ids = 0}\n",
     ["max_batch_size > 0"]),
    ("max_batch_size = 8\n[[input]]\nname = \"input_ids\"\ndata_type = \"TYPE_INT64\"\ndims = [6]\n"
     "[[input]]\nname = \"attention_mask\"\ndata_type = \"TYPE_INT64\"\ndims = [6]\n"
     "[dynamic_batching.padding]\naxis = 1\ninputs = {input_ids = 0}\n", ["inputs.input_ids", "dynamic", "[-1, 6]"]),
])
def test_padding_engine_errors(tmp_path, engine, text, words):
    with pytest.raises(ConfigError) as e:
        _config(tmp_path, text).complete(engine)
    assert "[dynamic_batching.padding]" in str(e.value)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


# ---------------------------------------------------------------- the batcher, on a recording engine


@dataclass
class _RecordingEngine:
    """ids → y = ids * 10 (per position) and n = the row's count of mask ones; records every batch's feeds."""

    feeds: list = field(default_factory=list)

    def create_context(self, **options):
        return self

    def run(self, feeds):
        self.feeds.append({k: v.copy() for k, v in feeds.items()})
        return {"y": feeds["ids"].astype(np.float32) * 10, "n": feeds["mask"].sum(axis=1),
                "rows": np.arange(len(feeds["ids"]), dtype=np.int64)}


def test_batcher_pads_cuts_and_respects_the_profiles():
    engine = _RecordingEngine()
    # profile boxes: up to 4 rows of length <= 8, or 2 rows of length <= 32
    batcher = DynamicBatcher(engine, max_batch_size=4, max_queue_delay_s=0.2, name="fake",
                             padding=Padding(1, {"ids": -1, "mask": 0}, ["y"]), padding_limits=[(4, 8), (2, 32)])
    lengths = [3, 20, 4, 5, 6]

    async def main():
        reqs = [{"ids": np.arange(1, n + 1, dtype=np.int64)[None], "mask": np.ones((1, n), np.int64),
                 "other": np.full((1, 2), i, np.float32)} for i, n in enumerate(lengths)]
        outs = await asyncio.gather(*(batcher.submit(r, 1) for r in reqs))
        with pytest.raises(BadRequest, match="different lengths"):
            await batcher.submit({"ids": np.ones((1, 3), np.int64), "mask": np.ones((1, 4), np.int64),
                                  "other": np.ones((1, 2), np.float32)}, 1)
        await batcher.close()
        return reqs, outs

    reqs, outs = asyncio.run(main())
    # 3 and 20 fit the (2, 32) box; 4 more rows would not, so 4, 5, 6 wait and form the next (4, 8) batch
    assert [f["ids"].shape for f in engine.feeds] == [(2, 20), (3, 6)]
    first = engine.feeds[0]
    assert first["ids"][0].tolist() == [1, 2, 3] + [-1] * 17 and first["mask"][0].tolist() == [1] * 3 + [0] * 17
    assert first["ids"][1].tolist() == list(range(1, 21)) and first["other"].tolist() == [[0, 0], [1, 1]]
    for r, o, n in zip(reqs, outs, lengths):
        np.testing.assert_array_equal(o["y"], r["ids"].astype(np.float32) * 10)  # cut back to its length
        assert o["n"].tolist() == [n]  # not listed: returned as computed
    assert [o["rows"].tolist() for o in outs] == [[0], [1], [0], [1], [2]]


def test_batcher_pads_rows_to_a_bucket_and_lengths_to_a_multiple():
    """Few engine shapes (one CUDA graph each): 3 rows become a bucket of 4 (the last row repeated), lengths round up
    to a multiple of 8; nobody gets a pad row or position back."""
    engine = _RecordingEngine()
    batcher = DynamicBatcher(engine, max_batch_size=8, max_queue_delay_s=0.2, name="buckets",
                             padding=Padding(1, {"ids": -1, "mask": 0}, ["y"]), padding_limits=[(8, 32)],
                             batch_buckets=[1, 2, 4, 8], length_multiple=8)
    lengths = [3, 5, 9]

    async def main():
        reqs = [{"ids": np.arange(1, n + 1, dtype=np.int64)[None], "mask": np.ones((1, n), np.int64)}
                for n in lengths]
        outs = await asyncio.gather(*(batcher.submit(r, 1) for r in reqs))
        alone = await batcher.submit({"ids": np.array([[7, 8, 9]]), "mask": np.ones((1, 3), np.int64)}, 1)
        await batcher.close()
        return reqs, outs, alone

    reqs, outs, alone = asyncio.run(main())
    assert [f["ids"].shape for f in engine.feeds] == [(4, 16), (1, 8)]
    first = engine.feeds[0]
    assert first["ids"][3].tolist() == first["ids"][2].tolist()  # the pad row repeats the last one
    assert first["mask"][0].tolist() == [1] * 3 + [0] * 13
    for r, o, n in zip(reqs, outs, lengths):
        np.testing.assert_array_equal(o["y"], r["ids"].astype(np.float32) * 10)
        assert o["n"].tolist() == [n] and o["rows"].shape == (1,)
    assert [o["rows"].tolist() for o in outs] == [[0], [1], [2]]
    np.testing.assert_array_equal(alone["y"], [[70.0, 80.0, 90.0]])


def test_batcher_without_padding_never_merges_lengths():
    engine = _RecordingEngine()
    batcher = DynamicBatcher(engine, max_batch_size=8, max_queue_delay_s=0.05, name="plain")

    async def main():
        reqs = [{"ids": np.ones((1, n), np.int64), "mask": np.ones((1, n), np.int64)} for n in (2, 3, 2, 3)]
        await asyncio.gather(*(batcher.submit(r, 1) for r in reqs))
        await batcher.close()

    asyncio.run(main())
    assert sorted(f["ids"].shape for f in engine.feeds) == [(2, 2), (2, 3)]


# ---------------------------------------------------------------- a real server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("padding") / "models"
    model = masked_attention_onnx().SerializeToString()
    batching = "[dynamic_batching]\nmax_queue_delay_microseconds = 300000\n"
    for name, extra in (("padded", PADDING), ("plain", "")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(model)
        (root / name / "config.toml").write_text(f"max_batch_size = {MAX_BATCH}\n{PROFILES}{batching}{extra}")
    with serving(root, grpc=False) as (url, *_):
        yield url, root


def _concurrent(url: str, model: str, requests: list[dict]) -> list[dict]:
    """Send every request at once (one client per thread) and return each one's outputs."""
    import tritonclient.http as httpclient

    start = threading.Barrier(len(requests))

    def one(feeds):
        client = httpclient.InferenceServerClient(url)
        try:
            inputs = []
            for name, a in feeds.items():
                inputs.append(httpclient.InferInput(name, list(a.shape), "INT64").set_data_from_numpy(a))
            start.wait(30)
            result = client.infer(model, inputs)
            return {n: result.as_numpy(n) for n in ("embeddings", "last_hidden_state", "pooled")}
        finally:
            client.close()

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(one, requests))


def _stats(url: str, model: str) -> dict:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url)
    try:
        return client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()


def test_different_lengths_merged_and_answered_as_alone(server):
    url, root = server
    shapes = [(1, 3), (1, 9), (2, 5), (1, 16), (1, 1), (1, 12), (1, 7)]  # 8 rows, every length different
    requests = [tokens(rows, length, seed) for seed, (rows, length) in enumerate(shapes)]
    answers = _concurrent(url, "padded", requests)
    stats = _stats(url, "padded")
    assert stats["inference_count"] == 8 and stats["inference_stats"]["success"]["count"] == len(requests)
    assert stats["execution_count"] < len(requests), stats  # some requests of different lengths shared a batch
    assert any(int(b["batch_size"]) > 2 for b in stats["batch_stats"]), stats["batch_stats"]
    ctx = kiln.load(root / "padded" / "1" / "model.plan").create_context()  # the engine the server built
    for feeds, got in zip(requests, answers):
        alone = ctx.run(feeds)
        assert got["last_hidden_state"].shape == feeds["input_ids"].shape + (HIDDEN,)
        np.testing.assert_array_equal(got["embeddings"], alone["embeddings"])  # a gather: exact
        np.testing.assert_allclose(got["last_hidden_state"], alone["last_hidden_state"], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(got["pooled"], alone["pooled"], rtol=RTOL, atol=ATOL)


def test_without_padding_lengths_are_never_merged(server):
    url, root = server
    requests = [tokens(1, length, seed) for seed, length in enumerate(range(2, 8))]
    answers = _concurrent(url, "plain", requests)
    stats = _stats(url, "plain")
    assert stats["execution_count"] == len(requests)
    assert [int(b["batch_size"]) for b in stats["batch_stats"]] == [1]
    ctx = kiln.load(root / "plain" / "1" / "model.plan").create_context()
    for feeds, got in zip(requests, answers):
        np.testing.assert_array_equal(got["embeddings"], ctx.run(feeds)["embeddings"])


def _post_json(url: str, model: str, body: dict) -> tuple[int, dict]:
    """(status, JSON answer) of a JSON infer request."""
    import http.client
    import json

    conn = http.client.HTTPConnection(url, timeout=30)
    try:
        conn.request("POST", f"/v2/models/{model}/infer", body=json.dumps(body))
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def test_padded_inputs_of_different_lengths_are_a_400(server):
    url, _ = server
    body = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 3], "data": [1, 2, 3]},
                       {"name": "attention_mask", "datatype": "INT64", "shape": [1, 4], "data": [1, 1, 1, 1]}]}
    status, doc = _post_json(url, "padded", body)
    assert status == 400 and "different lengths [3, 4]" in doc["error"] and "input_ids" in doc["error"], doc


def test_an_id_outside_the_embedding_table_is_a_400(server):
    """The server checks ids against the table they index before the batch goes to the engine (on a GPU the engine
    gets them on the device, where nothing reads them back)."""
    url, _ = server
    body = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 3], "data": [1, VOCAB, 2]},
                       {"name": "attention_mask", "datatype": "INT64", "shape": [1, 3], "data": [1, 1, 1]}]}
    status, doc = _post_json(url, "plain", body)
    assert status == 400 and "input 'input_ids'" in doc["error"] and f"[-{VOCAB}, {VOCAB})" in doc["error"], doc


def test_ids_are_checked_with_the_request_not_by_the_engine(tmp_path, engine):
    """ServedModel checks ids itself (a CUDA engine gets the batch on the device, where nothing reads them back)."""
    from kiln.serve.model import ServedModel

    cfg = _config(tmp_path, f"max_batch_size = {MAX_BATCH}\n{PROFILES}").complete(engine)
    served = ServedModel("m", "1", cfg, engine)
    feeds = tokens(1, 4, 0)
    assert served._validate(feeds, None) == 1
    feeds["input_ids"][0, 2] = -VOCAB - 1
    with pytest.raises(BadRequest, match=rf"input 'input_ids': values must be in \[-{VOCAB}, {VOCAB}\)"):
        served._validate(feeds, None)


def test_batch_buckets_and_length_multiple(tmp_path, engine):
    """Buckets from config.toml, or on a GPU the powers of two, preferred sizes and max_batch_size; CPU: none."""
    from types import SimpleNamespace

    from kiln.serve.model import _batch_buckets, _length_multiple

    text = "max_batch_size = 6\n[dynamic_batching]\npreferred_batch_size = [3]\n"
    cfg = _config(tmp_path, text).complete(engine)
    gpu = SimpleNamespace(device=SimpleNamespace(backend="cuda"))
    assert _batch_buckets(gpu, cfg) == [1, 2, 3, 4, 6]
    assert _batch_buckets(engine, cfg) == []  # the CPU engine: no padding
    cfg = _config(tmp_path, text + "batch_buckets = [4, 64, 6]\n").complete(engine)
    assert _batch_buckets(engine, cfg) == [4, 6]  # beyond max_batch_size: dropped
    assert _length_multiple(gpu, Padding(1, {"x": 0})) == 16 and _length_multiple(engine, Padding(1, {"x": 0})) == 1
    assert _length_multiple(gpu, Padding(1, {"x": 0}, [], 4)) == 4
    for bad, words in (("batch_buckets = 8", "must be a list"), ("batch_buckets = [0]", "batch buckets >= 1")):
        with pytest.raises(ConfigError, match=words):
            _config(tmp_path, text + bad + "\n").complete(engine)
    with pytest.raises(ConfigError, match="length_multiple"):
        _config(tmp_path, f"max_batch_size = 8\n{PADDING}length_multiple = 0\n")


# ---------------------------------------------------------------- warm-up at the batch buckets


@dataclass
class _Contexts:
    """An engine whose every context records the feed shapes it ran; `refuse`: contexts raise a KilnError."""

    runs: list = field(default_factory=list)
    refuse: bool = False

    def create_context(self, **options):
        engine = self

        class Ctx:
            graphs = None  # no CUDA graphs: the warm-up runs each bucket once

            def run(self, feeds):
                if engine.refuse:
                    raise InputError("zeros are not valid here")
                engine.runs.append((id(self), {k: v.shape for k, v in feeds.items()}))
                return {"y": feeds["x"]}

        return Ctx()


def _served(engine, **batching):
    from kiln.serve.config import DynamicBatching, ModelConfig, TensorConfig
    from kiln.serve.model import ServedModel

    cfg = ModelConfig("m", max_batch_size=4, input=[TensorConfig("x", "FP32", [3])],
                      output=[TensorConfig("y", "FP32", [3])], dynamic_batching=DynamicBatching(**batching),
                      instance_count=2)
    return ServedModel("m", "1", cfg, engine)


def test_warm_up_runs_every_context_at_every_bucket():
    engine = _Contexts()
    assert _served(engine, batch_buckets=[1, 2, 4]).warmed == [1, 2, 4]
    assert sorted(shape["x"] for _, shape in engine.runs) == [(1, 3)] * 2 + [(2, 3)] * 2 + [(4, 3)] * 2
    assert len({ctx for ctx, _ in engine.runs}) == 2  # both instances


def test_warm_up_is_skipped_without_buckets_or_when_off_or_refused():
    engine = _Contexts()
    assert _served(engine).warmed == []  # no buckets: the CPU default
    assert _served(engine, batch_buckets=[1, 2], warmup=False).warmed == []
    assert engine.runs == []
    refused = _served(_Contexts(refuse=True), batch_buckets=[1, 2])  # loads, cold
    assert refused.warmed == []
