"""Plans that say where they can run: fingerprint, policies strict/warn/retune, hardware-compat classes,
timing caches and JSON read as untrusted data."""

from __future__ import annotations

import json
import math
import sqlite3
import warnings

import numpy as np
import pytest
from onnx import TensorProto as T, helper
from typer.testing import CliRunner

import kiln
from kiln.target.device import Device, detect
from kiln.builder.timing_cache import CachedChoice, TimingCache, environment_key
from kiln.cli.app import app
from kiln.engine import compat, plan as planfile, retune as retune_mod
from kiln.engine.compat import CompatibilityWarning, Policy
from kiln.util.safe_json import load_json, loads_json
from kiln.errors import ConfigError, EngineCompatibilityError, PlanError
from kiln.kernels import gemm
from kiln.tactics import registry
from kiln.target.hardware_compat import PORTABLE_SMEM, HardwareCompat, smem_budget


def _model():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu0")], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _plan(tmp_path, **config):
    p = tmp_path / "m.plan"
    kiln.build(_model(), kiln.BuildConfig(device="cpu", **config)).save(p)
    return p


def _rewrite_header(path, top=None, **device):
    header, payload = planfile.unpack(path.read_bytes())
    header["device"].update(device)
    header.update(top or {})
    path.write_bytes(planfile.pack_header(header) + payload)  # a well-formed edit: the header checksum recomputed


def test_header_records_fingerprint_compat_class_and_rebuild_command(tmp_path):
    p = _plan(tmp_path, hardware_compat="portable", fp16=True)
    h = planfile.read_header(p)
    assert h["device"] == detect("cpu").fingerprint()
    assert {"backend", "name", "kiln", "torch", "triton"} <= set(h["device"])
    assert h["hardware_compat"] == "portable"
    assert h["rebuild"].startswith("kiln build ") and "--fp16" in h["rebuild"] and "portable" in h["rebuild"]
    out = CliRunner().invoke(app, ["inspect", "--header", "--json", str(p)])
    assert out.exit_code == 0 and json.loads(out.stdout)["header"]["hardware_compat"] == "portable"


def test_strict_warn_retune_on_a_plan_from_another_machine(tmp_path):
    p = _plan(tmp_path)
    _rewrite_header(p, name="riscv-box", kiln="0.0.9", triton="2.0.0")
    with pytest.raises(EngineCompatibilityError) as e:
        kiln.load(p)
    msg = str(e.value)
    for part in ("kiln: built with '0.0.9'", "triton: built with '2.0.0'", "riscv-box", "kiln build",
                 "kiln retune", "--policy warn"):
        assert part in msg, part
    with pytest.warns(CompatibilityWarning, match="0.0.9"):
        engine = kiln.load(p, policy="warn")
    assert engine.run({"x": -np.ones((2, 3), np.float32)})["y"].max() == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # retune says what it did in build_info, not as a warning
        tuned = kiln.load(p, policy="retune")
    assert tuned.build_info["retune"]["from"] == "riscv-box"
    assert any("0.0.9" in d for d in tuned.build_info["retune"]["differences"])
    tuned.save(tmp_path / "new.plan")
    h = planfile.read_header(tmp_path / "new.plan")
    assert h["device"] == detect("cpu").fingerprint() and h["retuned_from"] == "riscv-box"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = kiln.load(tmp_path / "new.plan")  # strict, no difference left
    np.testing.assert_array_equal(again.run({"x": np.ones((2, 3), np.float32)})["y"], np.ones((2, 3)))


def test_a_loaded_plan_saved_again_keeps_the_device_it_was_tuned_on(tmp_path):
    p = _plan(tmp_path)
    _rewrite_header(p, name="riscv-box")  # differs only by CPU name: informational, strict loads with a warning
    with pytest.warns(CompatibilityWarning, match="riscv-box"):
        engine = kiln.load(p)
    engine.save(tmp_path / "copy.plan")
    assert planfile.read_header(tmp_path / "copy.plan")["device"]["name"] == "riscv-box"


def test_refusal_comes_from_the_header_before_the_payload_is_read(tmp_path):
    p = _plan(tmp_path)
    _rewrite_header(p, kiln="0.0.9")
    data = bytearray(p.read_bytes())
    data[-5] ^= 0xFF  # a corrupted payload: strict refuses on the header alone
    p.write_bytes(bytes(data))
    with pytest.raises(EngineCompatibilityError, match="0.0.9"):
        kiln.load(p)
    with pytest.raises(PlanError, match="checksum"), pytest.warns(CompatibilityWarning):
        kiln.load(p, policy="warn")


def test_retune_reruns_the_autotuner_with_cache_and_compat_class(tmp_path, monkeypatch):
    p = _plan(tmp_path, hardware_compat="same-cc", workspace_bytes=1 << 20)
    _rewrite_header(p, torch="1.0.0")
    seen = {}

    def fake_tune(net, weights, device, level, tf32, cache, progress, workspace, profile_shapes):
        seen.update(layers=[l.name for l in net.layers], compat=device.hardware_compat, cache=cache, level=level,
                    workspace=workspace)
        return [{l.name: registry_choice() for l in net.layers} for _ in profile_shapes]

    registry_choice = lambda: retune_mod.Choice(registry.REFERENCE, {}, 1.5, "timed")  # noqa: E731
    monkeypatch.setattr(retune_mod, "tune_profiles", fake_tune)
    cache = tmp_path / "t.db"
    engine = kiln.load(p, policy="retune", timing_cache=cache)
    assert seen["layers"] == [l.name for l in engine.network.layers] and seen["compat"] == "same-cc"
    assert seen["workspace"] == 1 << 20
    assert seen["level"] == 3 and engine.tactics[engine.network.layers[0].name].microseconds == 1.5
    assert engine.build_info["retune"]["layers"] == len(engine.network.layers)
    r = CliRunner().invoke(app, ["retune", str(p), "-o", str(tmp_path / "r.plan"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["differences"] == ["torch: built with '1.0.0', running " +
                                                    repr(detect("cpu").fingerprint()["torch"])]
    assert planfile.read_header(tmp_path / "r.plan")["hardware_compat"] == "same-cc"


H100 = {"backend": "cuda", "name": "NVIDIA H100 PCIe", "cc": "9.0", "sms": 114, "memory": 85 * 10**9, "kiln": "0.1.0",
        "torch": "2.13.0", "triton": "3.9.0", "cuda": "12.8", "driver": "570.1"}
H200 = dict(H100, name="NVIDIA H200", sms=132, memory=150 * 10**9, driver="575.2")


class _FakeGPU:
    def __init__(self, fp):
        self.fp, self.name, self.backend, self.torch_device = fp, fp["name"], "cuda", "cuda"

    def fingerprint(self):
        return dict(self.fp)


@pytest.fixture
def on_h200(monkeypatch):
    monkeypatch.setattr(compat.torch.cuda, "is_available", lambda: True)
    state = {"fp": H200}
    monkeypatch.setattr(compat, "detect", lambda backend: _FakeGPU(state["fp"]))
    return state


def test_gpu_policies_by_hardware_compat_class(on_h200):
    none = {"device": H100, "hardware_compat": "none", "rebuild": "kiln build m.onnx -o m.plan --fp16"}
    r = compat.compare(none)
    assert [d.split(":")[0] for d in r.blocking] == ["name", "sms", "memory"] and "driver" in r.notes[0]
    with pytest.raises(EngineCompatibilityError) as e:
        compat.check(none, "strict", "m.plan")
    assert "NVIDIA H100 PCIe" in str(e.value) and "NVIDIA H200" in str(e.value)
    # the plan's recorded command is quoted as data, not offered as a command to run
    assert "the plan says it was built with: 'kiln build m.onnx -o m.plan --fp16'" in str(e.value)
    assert "`kiln build m.onnx -o m.plan --fp16`" not in str(e.value) and "kiln retune m.plan" in str(e.value)
    with pytest.warns(CompatibilityWarning, match="H100 PCIe"):
        compat.check(none, "warn", "m.plan")
    for cls in ("same-cc", "portable"):  # loads under strict, saying where it was tuned
        with pytest.warns(CompatibilityWarning, match=f"hardware-compat {cls}.*H100 PCIe"):
            assert not compat.check(dict(none, hardware_compat=cls), "strict", "m.plan").blocking
    ampere = dict(none, device=dict(H100, name="NVIDIA A100", cc="8.0"))
    with pytest.raises(EngineCompatibilityError, match="cc: built with '8.0', running '9.0'.*same-cc"):
        compat.check(dict(ampere, hardware_compat="same-cc"), "strict")
    with pytest.warns(CompatibilityWarning):
        compat.check(dict(ampere, hardware_compat="portable"), "strict")
    on_h200["fp"] = dict(H200, name="Tesla T4", cc="7.5")
    with pytest.raises(EngineCompatibilityError, match="portable, for sm80"):
        compat.check(dict(ampere, hardware_compat="portable"), "strict")
    newer = dict(none, device=dict(H200, triton="9.9.9"), hardware_compat="portable")
    on_h200["fp"] = H200
    with pytest.raises(EngineCompatibilityError, match="triton"):  # software always matters
        compat.check(newer, "strict")
    with pytest.raises(EngineCompatibilityError, match="not one of"):
        compat.check(none, "sometimes")


def test_hardware_compat_filters_tactics_and_shared_memory(monkeypatch):
    fp8 = registry.Tactic("fake_fp8_gemm", ("Relu",), lambda s, c, d: None, arch_specific=True)
    sized = registry.Tactic("fake_sm_sized", ("Relu",), lambda s, c, d: None, card_specific=True)
    registry._load()
    monkeypatch.setitem(registry.BY_KIND, "Relu", [fp8, sized])
    spec = type("Spec", (), {"kind": "Relu"})()
    names = lambda compat_: [t.name for t in registry.candidates(spec, Device("cuda", "g", "cuda", compat_))[0]]  # noqa
    assert names("none") == ["fake_fp8_gemm", "fake_sm_sized", "reference"]
    assert names("same-cc") == ["fake_fp8_gemm", "reference"]
    assert names("portable") == ["reference"]
    refused = dict(registry.candidates(spec, Device("cuda", "g", "cuda", "portable"))[1])
    assert "hardware-compat portable" in refused["fake_fp8_gemm"] and "SM count" in refused["fake_sm_sized"]
    portable, native = Device("cuda", "g", "cuda", "portable"), Device("cuda", "g", "cuda")
    assert smem_budget(portable, 227 * 1024) == PORTABLE_SMEM and smem_budget(native, 227 * 1024) == 227 * 1024
    big = gemm.configs(4096, 4096, 4096, 2, 227 * 1024, 3)
    small = gemm.configs(4096, 4096, 4096, 2, smem_budget(portable, 227 * 1024), 3)
    assert max(gemm.smem_bytes(c, 2) for c in big) > PORTABLE_SMEM
    assert small and max(gemm.smem_bytes(c, 2) for c in small) <= PORTABLE_SMEM
    with pytest.raises(ConfigError, match="none, same-cc, portable"):
        kiln.BuildConfig(hardware_compat="anywhere")
    assert HardwareCompat.parse("same-cc").describe().startswith("hardware-compat same-cc")


def test_build_summary_notes_the_compat_class(tmp_path):
    onnx_path = tmp_path / "m.onnx"
    onnx_path.write_bytes(_model().SerializeToString())
    r = CliRunner().invoke(app, ["build", str(onnx_path), "--device", "cpu", "--hardware-compat", "portable",
                                 "--json"])
    assert r.exit_code == 0, r.output
    assert any(n.startswith("hardware-compat portable") for n in json.loads(r.stdout)["notes"])
    r = CliRunner().invoke(app, ["build", str(onnx_path), "--hardware-compat", "everywhere"])
    assert r.exit_code == 1 and "none, same-cc, portable" in r.output


def test_cli_policy_strict_refuses_warn_runs(tmp_path):
    p = _plan(tmp_path)
    _rewrite_header(p, kiln="0.0.9")
    r = CliRunner().invoke(app, ["run", str(p)])
    assert r.exit_code == 1 and "0.0.9" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["run", str(p), "--policy", "warn", "--json"])
    assert r.exit_code == 0 and "warning:" in r.stderr and "0.0.9" in r.stderr
    assert json.loads(r.stdout)["y"]["shape"] == [2, 3]


def test_timing_cache_keys_and_hostile_rows(tmp_path):
    fp = {"name": "H100", "cc": "9.0", "kiln": "0.1.0"}
    assert environment_key(fp) != environment_key(dict(fp, hardware_compat="portable"))
    assert environment_key(fp) == environment_key(dict(fp, hardware_compat="none"))
    cache = TimingCache(tmp_path / "t.db")
    cache.put("e", "ok", CachedChoice("triton_matmul", {"BLOCK_M": 64}, 3.0))
    with sqlite3.connect(tmp_path / "t.db") as db:
        bad = [(b"\x00", "{}", 1.0), ("t", b"{}", 1.0), ("t", "[1]", 1.0), ("t", "not json", 1.0),
               ("t", '{"a": {"b": 1}}', 1.0), ("t", "{}", -1.0), ("t", "{}", "fast"), ("t", "x" * (1 << 17), 1.0),
               ("x" * 500, "{}", 1.0),
               ("t", '{"a": NaN}', 1.0), ("t", "{}", math.inf)]
        db.executemany("INSERT INTO timings VALUES ('e', ?, ?, ?, ?)", [(f"s{i}", *r) for i, r in enumerate(bad)])
    assert cache.get("e", "ok") == CachedChoice("triton_matmul", {"BLOCK_M": 64}, 3.0)
    assert all(cache.get("e", f"s{i}") is None for i in range(len(bad)))
    assert cache.invalid == len(bad)
    with sqlite3.connect(tmp_path / "t.db") as db:
        db.execute("CREATE TRIGGER evil AFTER INSERT ON timings BEGIN DELETE FROM timings; END")
    with pytest.raises(ConfigError, match="trigger 'evil'"):
        TimingCache(tmp_path / "t.db")
    with sqlite3.connect(tmp_path / "other.db") as db:
        db.execute("CREATE TABLE timings (a TEXT)")
    with pytest.raises(ConfigError, match="columns"):
        TimingCache(tmp_path / "other.db")


def test_safe_json_limits(tmp_path):
    assert loads_json(b'{"a": [1, 2, {"b": null}]}') == {"a": [1, 2, {"b": None}]}
    for bad, why in [(b"[" * 100 + b"]" * 100, "deeper"), (b'{"a": 1, "a": 2}', "duplicate"),
                     (b'{"a": NaN}', "NaN"), (b"[1, 2]", "not dict"), (b"\xff\xfe", "JSON"),
                     (b'{"a": "' + b"x" * 2000 + b'"}', "longer")]:
        with pytest.raises(ConfigError, match=why):
            loads_json(bad, max_depth=64, max_string=1000)
    with pytest.raises(ConfigError, match="more than 10 values"):
        loads_json(json.dumps({"a": list(range(20))}), max_values=10)
    assert loads_json(b'{"a": NaN}', allow_nan=True)["a"] != 0
    f = tmp_path / "calib.json"
    f.write_text(json.dumps({"conv1": [0.5, 1.0]}))
    assert load_json(f, max_bytes=100, what="calibration cache") == {"conv1": [0.5, 1.0]}
    with pytest.raises(PlanError, match="calibration cache .* over the 10 byte limit"):
        load_json(f, max_bytes=10, what="calibration cache", error=PlanError)
    (tmp_path / "link.json").symlink_to(f)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_json(tmp_path / "link.json")
    assert Policy.parse("retune") is Policy.RETUNE


@pytest.mark.gpu
def test_gpu_portable_build_keeps_triton_configs_within_48k_and_retunes(tmp_path):
    w = helper.make_tensor("w", T.FLOAT, [512, 512], np.random.default_rng(0).standard_normal(512 * 512) * 0.05)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [512, 512])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [512, 512])], initializer=[w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cache = tmp_path / "t.db"
    engine = kiln.build(model, kiln.BuildConfig(fp16=True, device="cuda", hardware_compat="portable",
                                                timing_cache=str(cache)))
    for choice in engine.tactics.values():
        if "BLOCK_K" in choice.config:
            assert gemm.smem_bytes(choice.config, 2) <= PORTABLE_SMEM
    p = tmp_path / "p.plan"
    engine.save(p)
    assert planfile.read_header(p)["hardware_compat"] == "portable"
    tuned = kiln.Engine.load(p, "retune", timing_cache=cache, force_retune=True)
    assert tuned.build_info["retune"]["timing_cache"]["hits"] >= 1  # the build filled the cache
    x = np.random.default_rng(1).standard_normal((512, 512)).astype(np.float32)
    np.testing.assert_allclose(tuned.run({"x": x})["y"], engine.run({"x": x})["y"], rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_a_tactic_this_gpu_cannot_run_falls_back_to_the_reference_with_a_note():
    """A plan's tactic whose supports() refuses the layer here (fp8 on a GPU without fp8, a tactic a newer kiln
    narrowed) runs the reference, says so in load_notes, and gives the reference's result."""
    from kiln.tactics.choice import Choice
    from kiln.runtime import Engine
    from kiln.ir import DType, Layer, Network

    net = Network("n")
    net.add_tensor("x", DType.INT32, (4, 8))
    net.add_tensor("y", DType.INT32, (4, 8))
    net.inputs, net.outputs = ["x"], ["y"]
    net.layers = [Layer("r", "Relu", ["x"], ["y"])]  # the Triton pointwise kernel takes float layers only
    engine = Engine(net, kiln.BuildConfig(device="cuda"), detect("cuda"), tactics={"r": Choice("triton_pointwise")})
    assert engine.compiled == {} and "this GPU cannot run it" in engine.build_info["load_notes"][0]
    x = np.random.default_rng(0).integers(-5, 5, (4, 8)).astype(np.int32)
    np.testing.assert_array_equal(engine.run({"x": x})["y"], np.maximum(x, 0))
