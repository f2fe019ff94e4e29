"""The kiln.compile vs export + kiln.build probe (benchmarks/probes/gpu_compile_vs_build.py) end to end in its
--smoke mode on the CPU: every row runs, outputs agree with eager fp32, the JSON and markdown are written."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")


def test_smoke_mode_runs_on_the_cpu(tmp_path):
    from benchmarks.probes import gpu_compile_vs_build as probe

    results = probe.main(["--smoke", "--device", "cpu", "--out", str(tmp_path / "out"), "--cache",
                          str(tmp_path / "cache"), "--iterations", "2"])
    rows = results["rows"]
    assert [(r["model"], r["batch"]) for r in rows] == [("tiny-cnn", 1), ("tiny-cnn", 2), ("bert-tiny", 1),
                                                        ("bert-tiny", 2)]
    for r in rows:
        assert "skipped" not in r, r
        # fp16 against eager fp32: cosine ≥ 0.999 (fp16 keeps ~3 decimal digits; these nets are shallow)
        assert min(r["compile_cosine"], r["build_cosine"], r["eager_cosine"]) >= 0.999, r
        assert r["compile_over_build"] > 0 and r["build_s"] >= 0
    (js,) = (tmp_path / "out").glob("compile-vs-build-*.json")
    assert json.loads(js.read_text())["rows"] == json.loads(json.dumps(rows))
    md = js.with_suffix(".md").read_text()
    assert md.count("| tiny-cnn |") == 2 and "compile ÷ build" in md
