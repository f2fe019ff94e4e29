"""Signed plans: `kiln keygen`, `build --sign-key`, `load(verify_key=...)`; unsigned, re-signed or edited plans
are refused when a key is configured."""

from __future__ import annotations

import stat

import numpy as np
import pytest
from onnx import TensorProto as T, helper
from typer.testing import CliRunner

import kiln
from kiln.cli.app import app
from kiln.engine import plan as planfile, signing
from kiln.errors import ConfigError, PlanError, SignatureError


def _onnx(path):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])])
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


@pytest.fixture
def keys(tmp_path):
    return signing.generate(tmp_path / "key"), signing.generate(tmp_path / "other")


def _header_edit(path, **changes):
    """Rewrite header fields, keeping the (now stale) signature."""
    header, payload = planfile.unpack(path.read_bytes())
    header.update(changes)
    path.write_bytes(planfile.pack_header(header) + payload)  # header checksum recomputed: the signature must catch it


def test_sign_verify_and_refusals(tmp_path, keys):
    (key, pub), (other, other_pub) = keys
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and pub.read_text().startswith("-----BEGIN PUBLIC KEY")
    engine = kiln.build(_onnx(tmp_path / "m.onnx"), kiln.BuildConfig(device="cpu"))
    signed, unsigned = tmp_path / "s.plan", tmp_path / "u.plan"
    engine.save(signed, sign_key=key)
    engine.save(unsigned)
    assert planfile.read_header(signed)["signature"]["key_id"] == signing.key_id(signing.load_public_key(pub))
    out = kiln.load(signed, verify_key=pub).run({"x": -np.ones((2, 3), np.float32)})
    assert out["y"].max() == 0
    kiln.load(signed)  # no key configured: signatures are not required
    with pytest.raises(SignatureError, match="not signed"):
        kiln.load(unsigned, verify_key=pub)
    with pytest.raises(SignatureError, match="another key"):
        kiln.load(signed, verify_key=other_pub)
    engine.save(tmp_path / "o.plan", sign_key=signing.load_private_key(other))
    with pytest.raises(SignatureError, match="another key"):
        kiln.load(tmp_path / "o.plan", verify_key=pub)
    _header_edit(signed, hardware_compat="portable")  # claims a compat class it was not built with
    with pytest.raises(SignatureError, match="modified"):
        kiln.load(signed, verify_key=pub)
    assert issubclass(SignatureError, PlanError)


def test_payload_edit_is_caught_by_the_signed_checksum(tmp_path, keys):
    (key, pub), _ = keys
    p = tmp_path / "s.plan"
    kiln.build(_onnx(tmp_path / "m.onnx"), kiln.BuildConfig(device="cpu")).save(p, sign_key=key)
    data = bytearray(p.read_bytes())
    data[-3] ^= 1
    p.write_bytes(bytes(data))
    with pytest.raises(PlanError, match="checksum"):
        kiln.load(p, verify_key=pub)
    _header_edit(p, payload_sha256="0" * 64)  # re-pointing the checksum breaks the signature instead
    with pytest.raises(SignatureError):
        kiln.load(p, verify_key=pub)


def test_bad_key_files(tmp_path, keys):
    (key, pub), _ = keys
    with pytest.raises(ConfigError, match="already exists"):
        signing.generate(key)
    with pytest.raises(ConfigError, match="not an unencrypted PEM private key"):
        signing.load_private_key(pub)
    with pytest.raises(ConfigError, match="not a PEM public key"):
        signing.load_public_key(key)
    with pytest.raises(ConfigError, match="does not exist"):
        signing.load_public_key(tmp_path / "missing.pub")


def test_cli_keygen_build_sign_run_verify(tmp_path):
    r = CliRunner()
    model = _onnx(tmp_path / "m.onnx")
    key = tmp_path / "k"
    assert r.invoke(app, ["keygen", "-o", str(key)]).exit_code == 0
    out = r.invoke(app, ["build", str(model), "-o", str(tmp_path / "m.plan"), "--device", "cpu",
                         "--sign-key", str(key)])
    assert out.exit_code == 0, out.output
    assert r.invoke(app, ["run", str(tmp_path / "m.plan"), "--verify-key", f"{key}.pub"]).exit_code == 0
    assert r.invoke(app, ["build", str(model), "-o", str(tmp_path / "u.plan"), "--device", "cpu"]).exit_code == 0
    out = r.invoke(app, ["run", str(tmp_path / "u.plan"), "--verify-key", f"{key}.pub"])
    assert out.exit_code == 1 and "not signed" in out.output and "Traceback" not in out.output
    out = r.invoke(app, ["build", str(model), "--device", "cpu", "--sign-key", str(tmp_path / "nokey")])
    assert out.exit_code == 1 and "kiln keygen" in out.output and not (tmp_path / "m.plan.tmp").exists()
