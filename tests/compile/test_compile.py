"""kiln.compile (a torch module to kiln engines) and the torch.compile backend "kiln", on the CPU."""

from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from kiln.compile import module as compile_module
from kiln.errors import InputError, ModelError, UnsupportedOpError
from models.text import tiny_bert


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, stride=2)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.relu(self.conv2(y))
        return self.fc(y.mean(dim=(2, 3)))


class KwDict(torch.nn.Module):
    """Keyword-only arguments, a non-tensor argument, a dict result."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 4)

    def forward(self, x, *, bias, scale: float = 2.0):
        h = self.lin(x) * scale
        return {"h": h, "pair": (h + bias, torch.tanh(h))}


def _cnn():
    torch.manual_seed(0)
    m = SmallCNN().eval()
    with torch.no_grad():  # non-trivial running statistics, so BatchNorm folding is exercised
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m


@pytest.fixture
def count_builds(monkeypatch):
    calls = []
    real = compile_module.build_engine

    def counting(model, config, **kw):
        calls.append(config)
        return real(model, config, **kw)

    monkeypatch.setattr(compile_module, "build_engine", counting)
    return calls


def test_cnn_matches_eager_and_reuses_its_engine(count_builds):
    m = _cnn()
    x = torch.randn(2, 3, 16, 16)
    cm = kiln.compile(m, (x,), device="cpu")
    assert len(count_builds) == 1
    with torch.no_grad():
        want = m(x)
    got = cm(x)
    assert isinstance(got, torch.Tensor) and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    x2 = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(cm(x2), m(x2), rtol=1e-4, atol=1e-5)
    assert len(count_builds) == 1 and cm.builds == 1 and cm.hits >= 2  # same shapes: no rebuild
    cm(torch.randn(1, 3, 16, 16))  # a new static shape: a second engine
    assert len(count_builds) == 2
    with torch.no_grad():  # parameters changed in place: the engine is rebuilt with the new weights
        m.fc.bias.add_(1.0)
        want = m(x)
    torch.testing.assert_close(cm(x), want, rtol=1e-4, atol=1e-5)
    assert len(count_builds) == 3


def test_dynamic_batch_serves_two_sizes_from_one_engine(count_builds):
    m = _cnn()
    cm = kiln.compile(m, torch.randn(4, 3, 16, 16), dynamic={"x": {0: (1, 8)}}, device="cpu")
    (profile,) = count_builds[0].profiles
    assert profile["x"].min == (1, 3, 16, 16) and profile["x"].opt == (4, 3, 16, 16)
    assert profile["x"].max == (8, 3, 16, 16)
    for b in (2, 7):
        x = torch.randn(b, 3, 16, 16)
        with torch.no_grad():
            torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
    assert len(count_builds) == 1
    with pytest.raises(InputError, match="outside the dynamic range"):
        cm(torch.randn(9, 3, 16, 16))


def test_keyword_arguments_and_dict_results():
    torch.manual_seed(0)
    m = KwDict().eval()
    x, bias = torch.randn(3, 6), torch.randn(4)
    cm = kiln.compile(m, {"x": x, "bias": bias}, device="cpu")
    got = cm(x, bias=bias)
    with torch.no_grad():
        want = m(x, bias=bias)
    assert set(got) == {"h", "pair"} and isinstance(got["pair"], tuple) and len(got["pair"]) == 2
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert cm.builds == 1
    # another value of a non-tensor argument is baked into another engine
    got = cm(x, bias=bias, scale=0.5)
    with torch.no_grad():
        torch.testing.assert_close(got, m(x, bias=bias, scale=0.5), rtol=1e-4, atol=1e-5)
    assert cm.builds == 2
    with pytest.raises(InputError, match="do not fit"):
        cm(x)  # bias is required


def test_repeated_tensor_calls_take_the_quick_path(monkeypatch):
    """Calls with the same tensor signature skip binding and flattening; keyword order and values still count."""
    torch.manual_seed(0)
    m = KwDict().eval()
    x, bias = torch.randn(3, 6), torch.randn(4)
    cm = kiln.compile(m, {"x": x, "bias": bias}, device="cpu")
    cm(x, bias=bias)
    slow = []
    real = cm._flatten
    monkeypatch.setattr(cm, "_flatten", lambda *a: slow.append(1) or real(*a))
    for _ in range(3):
        x2, b2 = torch.randn(3, 6), torch.randn(4)
        with torch.no_grad():
            torch.testing.assert_close(cm(x2, bias=b2), m(x2, bias=b2), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(cm(bias=b2, x=x2), m(x2, bias=b2), rtol=1e-4, atol=1e-5)
    assert len(slow) == 1 and cm.builds == 1  # only the first keyword order went the slow way
    cm(x, bias=bias, scale=0.5)  # a non-tensor argument: the slow path, another engine
    assert len(slow) == 2 and cm.builds == 2


def test_tiny_bert_matches_eager_with_a_dynamic_batch(count_builds):
    m = tiny_bert(layers=1)
    torch.manual_seed(1)
    ids = torch.randint(0, 500, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 6:] = 0
    cm = kiln.compile(m, {"input_ids": ids, "attention_mask": mask}, device="cpu",
                      dynamic={"input_ids": {0: (1, 4)}, "attention_mask": {0: (1, 4)}})
    for b in (2, 3):
        ids = torch.randint(0, 500, (b, 8))
        mask = torch.ones(b, 8, dtype=torch.int64)
        mask[0, 5:] = 0
        got = cm(input_ids=ids, attention_mask=mask)
        with torch.no_grad():
            want = m(input_ids=ids, attention_mask=mask)
        assert type(got) is type(want)
        torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got.pooler_output, want.pooler_output, rtol=1e-4, atol=1e-4)
    assert len(count_builds) == 1


def test_an_unexportable_module_is_a_model_error():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x[x > 0].sum() if float(x.sum()) > 0 else x.nonzero()

    with pytest.raises(ModelError, match="could not export DataDependent"):
        kiln.compile(DataDependent(), torch.randn(4), device="cpu")


def test_torch_compile_backend_matches_eager(count_builds):
    torch._dynamo.reset()
    m = _cnn()
    x = torch.randn(2, 3, 16, 16)
    cm = torch.compile(m, backend="kiln", options={"device": "cpu"})
    with torch.no_grad():
        want = m(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error", kiln.compile.backend.KilnFallbackWarning)
            got = cm(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # the parameters and buffers dynamo passes as arguments are baked in: x is the engine's only input
    assert len(count_builds) == 1 and len(count_builds[0].profiles[0]) == 1


def test_torch_compile_backend_falls_back_to_torch_with_a_warning(monkeypatch):
    def refuse(model, config, **kw):
        raise UnsupportedOpError("op 'Conv' is not supported (forced by the test)")

    monkeypatch.setattr(compile_module, "build_engine", refuse)
    torch._dynamo.reset()
    m = _cnn()
    x = torch.randn(2, 3, 16, 16)
    cm = torch.compile(m, backend="kiln", options={"device": "cpu"})
    with torch.no_grad():
        want = m(x)
        with pytest.warns(kiln.compile.backend.KilnFallbackWarning, match="forced by the test"):
            got = cm(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(cm(x), want, rtol=1e-4, atol=1e-5)  # the fallback is remembered


class SmallMLP(torch.nn.Module):
    """Reads its batch size in the forward (a view): dynamo passes it as a SymInt argument once it goes dynamic."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).view(x.shape[0], 2, 2)


def _mlp():
    torch.manual_seed(0)
    return SmallMLP().eval()


@pytest.mark.parametrize("make, shape", [(_cnn, (3, 16, 16)), (_mlp, (6,))], ids=["cnn", "mlp"])
def test_torch_compile_backend_builds_one_dynamic_engine_once_dynamo_goes_dynamic(count_builds, make, shape):
    torch._dynamo.reset()
    m = make()
    cm = torch.compile(m, backend="kiln", options={"device": "cpu"})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", kiln.compile.backend.KilnFallbackWarning)
        for b in (2, 3, 5):
            x = torch.randn(b, *shape)
            torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
    # batch 2: dynamo's first, static graph (a static engine); batch 3: dynamo recompiles with a symbolic batch,
    # which gets one dynamic engine (min 1, opt the example's 3, max DYNAMIC_MAX or the bound dynamo's guards put
    # on the size: the CNN's convolutions guard batch < 16), that batch 5 reuses
    assert len(count_builds) == 2
    (static,), (dynamic,) = count_builds[0].profiles, count_builds[1].profiles
    assert [(p.min[0], p.opt[0], p.max[0]) for p in static.values()] == [(2, 2, 2)]
    ((lo, opt, hi),) = [(p.min[0], p.opt[0], p.max[0]) for p in dynamic.values()]
    assert (lo, opt) == (1, 3) and 5 <= hi <= kiln.compile.backend.DYNAMIC_MAX
    assert make is _cnn or hi == kiln.compile.backend.DYNAMIC_MAX


def test_torch_compile_backend_widens_a_dynamic_profile_a_size_leaves(count_builds):
    torch._dynamo.reset()
    m = _mlp()
    cm = torch.compile(m, backend="kiln", options={"device": "cpu"})
    big = kiln.compile.backend.DYNAMIC_MAX + 6
    with torch.no_grad():
        for b in (2, 3, big, 7):
            x = torch.randn(b, 6)
            torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
    assert len(count_builds) == 3  # static b2, dynamic b3, the dynamic one rebuilt wider for `big`; 7 reuses it
    (wide,) = count_builds[2].profiles
    assert [(p.min[0], p.max[0]) for p in wide.values()] == [(1, 2 * big)]
