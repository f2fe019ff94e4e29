"""collapse_views: a chain of layout layers that copies step by step but is one strided view as a whole becomes one
StridedView (nn.MultiheadAttention's head split); chains that are views already, or no view at all, stay."""

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto as T, helper, numpy_helper

from passcheck import apply, assert_same_outputs, imported, kinds, run
from kiln.ir import DType
from kiln.passes.collapse_views import collapse_views
from kiln.passes.eliminate_dead import eliminate_dead
from kiln.tactics import registry
from kiln.tactics.spec import LayerSpec, ValueSpec

rng = np.random.default_rng(0)
S, B, H, D = 5, 4, 2, 8
E = H * D


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _model(nodes, inits, x_shape, y_shape, first="Relu"):
    """x → nodes (the chain, ending in tensor "v") → `first` → y."""
    nodes = nodes + [helper.make_node(first, ["v"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", T.FLOAT, y_shape)], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _head_split(index, s=S, b=B, h=H, d=D):
    """torch's MHA export: packed [s, b, 3e] → q/k/v `index` → [b, h, s, d] through [s, b·h, d]."""
    e = h * d
    nodes = [helper.make_node("Relu", ["x"], ["p"]),  # a kernel makes the source, contiguous
             helper.make_node("Reshape", ["p", "s1"], ["a"]),
             helper.make_node("Unsqueeze", ["a", "zero"], ["b"]),
             helper.make_node("Transpose", ["b"], ["c"], perm=[3, 1, 2, 0, 4]),
             helper.make_node("Squeeze", ["c", "three"], ["d"]),
             helper.make_node("Gather", ["d", "idx"], ["e"], axis=0),
             helper.make_node("Reshape", ["e", "s2"], ["f"]),
             helper.make_node("Transpose", ["f"], ["g"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["g", "s3"], ["v"])]
    inits = [_ints("s1", [s, b, 3, e]), _ints("zero", [0]), _ints("three", [3]), _ints("idx", index),
             _ints("s2", [s, b * h, d]), _ints("s3", [b, h, s, d])]
    return _model(nodes, inits, [s, b, 3 * e], [b, h, s, d])


@pytest.mark.parametrize("index", [0, 1, 2])
def test_head_split_becomes_one_view(index):
    model = _head_split(index)
    before = imported(model)
    after, ctx = apply(before, collapse_views, eliminate_dead)
    assert kinds(after) == ["Relu", "StridedView", "Relu"]
    view = after.layers[1].attrs
    assert view == {"shape": [B, H, S, D], "strides": [3 * E, D, B * 3 * E, 1], "offset": index * E}
    assert ctx.log["collapse_views.layers"] == 7
    feeds = {"x": rng.standard_normal((S, B, 3 * E)).astype(np.float32)}
    assert_same_outputs(before, after, feeds, rtol=0, atol=0)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(run(after, feeds)["y"], want)


@pytest.mark.parametrize("sizes", [(3, 5, 4, 2, -1), (7, 2, 2, 3, 0), (2, 3, 3, 5, 1), (1, 4, 2, 8, 2)])
def test_head_splits_of_other_sizes(sizes):
    s, b, h, d, index = sizes
    before = imported(_head_split(index, s, b, h, d))
    after, _ = apply(before, collapse_views, eliminate_dead)
    assert kinds(after) == ["Relu", "StridedView", "Relu"]
    feeds = {"x": rng.standard_normal((s, b, 3 * h * d)).astype(np.float32)}
    assert_same_outputs(before, after, feeds, rtol=0, atol=0)


def _two_step(perm, shape, y_shape):
    nodes = [helper.make_node("Relu", ["x"], ["p"]), helper.make_node("Transpose", ["p"], ["t"], perm=perm),
             helper.make_node("Reshape", ["t", "s"], ["v"])]
    return _model(nodes, [_ints("s", shape)], [S, B, E], y_shape)


def test_chain_of_views_stays():
    """Transpose then a split of the last dim: each step is a view already."""
    before = imported(_two_step([1, 0, 2], [B, S, H, D], [B, S, H, D]))
    after, _ = apply(before, collapse_views, eliminate_dead)
    assert kinds(after) == kinds(before)


def test_chain_that_is_no_view_stays():
    """[S, B, E] → [B, S, E] → [B·S, E]: rows in another order, which no strided view gives."""
    before = imported(_two_step([1, 0, 2], [B * S, E], [B * S, E]))
    after, _ = apply(before, collapse_views, eliminate_dead)
    assert kinds(after) == kinds(before)
    feeds = {"x": rng.standard_normal((S, B, E)).astype(np.float32)}
    assert_same_outputs(before, after, feeds, rtol=0, atol=0)


def test_source_that_may_be_a_view_stays():
    """A chain below a Slice (a view at run time, not contiguous) is left to the step-by-step views."""
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax"], ["p"]),
             helper.make_node("Transpose", ["p"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["t", "s"], ["u"]),
             helper.make_node("Transpose", ["u"], ["v"], perm=[1, 0, 2])]
    inits = [_ints("st", [0]), _ints("en", [E]), _ints("ax", [2]), _ints("s", [B, S * H, D])]
    before = imported(_model(nodes, inits, [S, B, 2 * E], [S * H, B, D]))
    after, _ = apply(before, collapse_views, eliminate_dead)
    assert kinds(after) == kinds(before)


def test_view_tactic_aliases_a_contiguous_input_and_copies_another():
    spec = LayerSpec("v", "StridedView", {"shape": [B, H, S, D], "strides": [3 * E, D, B * 3 * E, 1], "offset": E},
                     (ValueSpec(DType.FLOAT32, (S, B, 3 * E)),), (ValueSpec(DType.FLOAT32, (B, H, S, D)),))
    tactic = registry.get("view_strided")
    assert tactic.supports(spec, None) is None
    run_view = tactic.compile(spec, {}, None)
    x = torch.randn(S, B, 3 * E)
    want = x[:, :, E:2 * E].reshape(S, B * H, D).transpose(0, 1).reshape(B, H, S, D)
    y = run_view([x])[0]
    assert torch.equal(y, want) and y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)  # same values, another layout
    assert torch.equal(run_view([xt])[0], want)


def test_multihead_attention_export_collapses_and_matches_onnxruntime(tmp_path):
    """torch's nn.MultiheadAttention (batch_first, as ViT uses it), built by kiln: q, k and v reach the attention
    as views of the packed projection, and the output projection runs on [S, B, E] rows."""
    import kiln
    from tests.models.export import export

    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = torch.nn.MultiheadAttention(E, H, batch_first=True)

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    path = export(Block(), (torch.randn(B, S, E),), tmp_path / "mha.onnx", dynamo=False, input_names=["x"],
                  output_names=["y"])
    engine = kiln.build(str(path), kiln.BuildConfig(device="cpu"))
    layers = kinds(engine.network)
    assert layers.count("StridedView") == 3 and "FusedAttention" in layers and "Gemm" not in layers, layers
    feeds = {"x": rng.standard_normal((B, S, E)).astype(np.float32)}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(engine.create_context().run(feeds)["y"], want, rtol=1e-4, atol=1e-5)


def _random_chain(r: np.random.Generator):
    """A random chain of Transpose / Reshape / Gather / Unsqueeze / Squeeze layers over a [4, 6, 6] source."""
    shape, nodes, inits, op = [4, 6, 6], [helper.make_node("Relu", ["x"], ["t0"])], [], ""
    for i in range(int(r.integers(2, 6))):
        # a Reshape mostly follows a Transpose: the steps that copy alone (the head split's pattern)
        op = "Reshape" if op == "Transpose" and r.random() < 0.8 else \
            str(r.choice(["Transpose", "Reshape", "Gather", "Unsqueeze", "Squeeze"]))
        src, dst = f"t{i}", f"t{i + 1}"
        if op == "Gather" and len(shape) > 1:
            axis = int(r.integers(len(shape)))
            inits.append(_ints(f"i{i}", int(r.integers(-shape[axis], shape[axis]))))
            nodes.append(helper.make_node("Gather", [src, f"i{i}"], [dst], axis=axis))
            shape = shape[:axis] + shape[axis + 1:]
        elif op == "Unsqueeze":
            axis = int(r.integers(len(shape) + 1))
            inits.append(_ints(f"a{i}", [axis]))
            nodes.append(helper.make_node("Unsqueeze", [src, f"a{i}"], [dst]))
            shape = shape[:axis] + [1] + shape[axis:]
        elif op == "Squeeze" and 1 in shape:
            axis = shape.index(1)
            inits.append(_ints(f"a{i}", [axis]))
            nodes.append(helper.make_node("Squeeze", [src, f"a{i}"], [dst]))
            shape = shape[:axis] + shape[axis + 1:]
        elif op == "Reshape":
            n, new = int(np.prod(shape)), []
            while int(np.prod(new or [1])) < n:  # split the element count into random factors
                rest = n // int(np.prod(new or [1]))
                new.append(int(r.choice([d for d in range(1, rest + 1) if rest % d == 0 and (d > 1 or rest == 1)])))
            inits.append(_ints(f"s{i}", new))
            nodes.append(helper.make_node("Reshape", [src, f"s{i}"], [dst]))
            shape = new
        else:
            perm = [int(p) for p in r.permutation(len(shape))]
            nodes.append(helper.make_node("Transpose", [src], [dst], perm=perm))
            shape = [shape[p] for p in perm]
    last = len(nodes) - 1
    nodes.append(helper.make_node("Neg", [f"t{last}"], ["y"]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [4, 6, 6])],
                          [helper.make_tensor_value_info("y", T.FLOAT, shape)], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_random_chains_keep_their_values():
    """Whatever random layout chains become (most stay: they are views step by step, or no view at all), the outputs
    stay exactly the unrewritten network's and onnxruntime's; the head-split tests above cover the rewrite itself."""
    r = np.random.default_rng(7)
    feeds = {"x": rng.standard_normal((4, 6, 6)).astype(np.float32)}
    for _ in range(80):
        model = _random_chain(r)
        before = imported(model)
        after, _ = apply(before, collapse_views, eliminate_dead)
        assert_same_outputs(before, after, feeds, rtol=0, atol=0)
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        np.testing.assert_array_equal(run(after, feeds)["y"], want[0])


def _dense_offsets(net, chain) -> torch.Tensor:
    """The chain applied to the source's element numbers by the layers' references: which element each output is."""
    from kiln.kinds import run_reference

    shape = net.tensors[chain[0].inputs[0]].shape
    o = torch.arange(int(np.prod(shape))).reshape(shape)
    for layer in chain:
        o = run_reference(layer.kind, [o, *(net.constants[i] if i else None for i in layer.inputs[1:])], layer.attrs)[0]
    return o


def test_the_factor_algebra_agrees_with_the_elements():
    """On random chains: where _affine finds a view, it picks exactly the elements the layers pick; where it finds
    none, no strided view picks them (the element numbers are not one stride per dim)."""
    from kiln.passes.collapse_views import _affine, _chain

    r, found = np.random.default_rng(11), 0
    for _ in range(150):
        net = imported(_random_chain(r))
        chain = _chain(net, [l for l in net.layers if l.kind != "Neg"][-1], net.producers())
        o, view = _dense_offsets(net, chain), _affine(net, chain)
        if view is not None:
            found += 1
            source = torch.arange(int(np.prod(net.tensors[chain[0].inputs[0]].shape)))
            picked = source.as_strided(view["shape"], view["strides"], view["offset"])
            assert torch.equal(picked, o)
            continue
        steps = [int(o.select(k, 1).reshape(-1)[0] - o.reshape(-1)[0]) if n > 1 else 0 for k, n in enumerate(o.shape)]
        grid = sum(torch.arange(n).reshape([n if j == k else 1 for j in range(o.dim())]) * st
                   for k, (n, st) in enumerate(zip(o.shape, steps))) + o.reshape(-1)[0]
        assert not torch.equal(o, grid.expand(o.shape) if o.dim() else grid)
    assert found > 50
