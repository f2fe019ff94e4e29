"""Issue 25, writes: one policy (kiln.util.files) for every file kiln writes at a path the user named."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time

import numpy as np
import pytest

import kiln
from kiln.builder.timing_cache import APPLICATION_ID, TimingCache
from kiln.errors import ConfigError, PlanError, SecurityError
from kiln.util import files
from test_cli import assert_one_error_line, invoke, model, plan  # noqa: F401 (fixtures)

FOREIGN = b"someone else's notes\n"


def build(model, out, *extra):
    return invoke("build", str(model), "-o", str(out), "--device", "cpu", "--shapes", "x:2x4", *extra)


def special_file(tmp_path, kind):
    """A FIFO, or a character device like /dev/null (made in tmp_path when root may, else /dev/null itself)."""
    if kind == "fifo":
        os.mkfifo(tmp_path / "pipe")
        return tmp_path / "pipe", stat.S_ISFIFO
    if os.geteuid() == 0:
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        return tmp_path / "null", stat.S_ISCHR
    return "/dev/null", stat.S_ISCHR  # not root: kiln could not replace it even if it tried


# -- devices, pipes, directories, links ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "chardev"])
def test_build_never_replaces_a_device_or_pipe_even_with_force(model, tmp_path, monkeypatch, kind):
    target, is_kind = special_file(tmp_path, kind)
    monkeypatch.setattr(kiln, "build", lambda *a, **k: pytest.fail("built before refusing the output path"))
    for extra in ((), ("--force",)):
        assert_one_error_line(build(model, target, *extra), str(target), "not a regular file")
        assert is_kind(os.lstat(target).st_mode)
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_run_output_dir_refuses_a_fifo_in_place_of_an_output(plan, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "y.npy")
    assert_one_error_line(invoke("run", str(plan), "--output-dir", str(out), "--force"), "y.npy", "regular file")
    assert stat.S_ISFIFO(os.lstat(out / "y.npy").st_mode)


@pytest.mark.parametrize("option", ["--export-times", "--export-profile"])
def test_bench_exports_refuse_symlinks_like_plans_do(plan, tmp_path, option):
    victim = tmp_path / "victim.json"
    victim.write_bytes(FOREIGN)
    (tmp_path / "link.json").symlink_to(victim)
    result = invoke("bench", str(plan), "--iterations", "2", "--warmup", "0", option, str(tmp_path / "link.json"),
                    "--force")
    assert_one_error_line(result, "symbolic link")
    assert victim.read_bytes() == FOREIGN


def test_plot_writes_exactly_the_path_named_and_refuses_a_directory(plan, tmp_path):
    pytest.importorskip("matplotlib")
    folder = tmp_path / "plots"
    folder.mkdir()
    assert_one_error_line(invoke("bench", str(plan), "--iterations", "2", "--plot", str(folder)),
                          "is a directory", "bench.png")
    assert not (tmp_path / "plots.png").exists() and not any(folder.iterdir())
    bare = tmp_path / "latency"
    assert invoke("bench", str(plan), "--iterations", "2", "--plot", str(bare)).exit_code == 0
    assert bare.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "latency.png").exists()
    assert invoke("bench", str(plan), "--iterations", "2", "--plot", str(bare)).exit_code == 0  # our own image


# -- existing files: kiln's own of the same kind are replaced, others need --force ------------------------------
def test_build_replaces_a_plan_but_a_foreign_file_only_with_force(model, tmp_path):
    out = tmp_path / "m.plan"
    assert build(model, out).exit_code == 0
    assert build(model, out).exit_code == 0  # a plan over a plan
    notes = tmp_path / "notes.txt"
    notes.write_bytes(FOREIGN)
    assert_one_error_line(build(model, notes), str(notes), "--force")
    assert notes.read_bytes() == FOREIGN
    assert build(model, notes, "--force").exit_code == 0
    assert notes.read_bytes()[:8] == b"KILNPLAN"


def test_retune_refuses_a_foreign_output_before_retuning(plan, tmp_path):
    out = tmp_path / "notes.txt"
    out.write_bytes(FOREIGN)
    assert_one_error_line(invoke("retune", str(plan), "-o", str(out)), str(out), "--force")
    assert out.read_bytes() == FOREIGN


def test_engine_save_refuses_a_foreign_file_unless_force(plan, tmp_path):
    engine, other = kiln.load(plan), tmp_path / "model.onnx.bak"
    other.write_bytes(FOREIGN)
    with pytest.raises(PlanError, match="force=True"):
        engine.save(other)
    assert other.read_bytes() == FOREIGN
    engine.save(other, force=True)
    assert kiln.load(other).outputs[0].name == engine.outputs[0].name


def test_run_replaces_its_npy_outputs_but_not_foreign_files(plan, tmp_path):
    out = tmp_path / "out"
    assert invoke("run", str(plan), "--output-dir", str(out)).exit_code == 0
    assert invoke("run", str(plan), "--output-dir", str(out), "--seed", "3").exit_code == 0  # .npy over .npy
    (out / "y.npy").write_bytes(FOREIGN)
    assert_one_error_line(invoke("run", str(plan), "--output-dir", str(out)), "y.npy", "--force")
    assert (out / "y.npy").read_bytes() == FOREIGN
    assert invoke("run", str(plan), "--output-dir", str(out), "--force").exit_code == 0
    assert np.load(out / "y.npy").shape == (2, 4)


@pytest.mark.parametrize("option, key", [("--export-times", "iterations"), ("--export-profile", "layers")])
def test_bench_exports_replace_their_own_json_only(plan, tmp_path, option, key):
    out = tmp_path / "export.json"
    args = ("bench", str(plan), "--iterations", "2", "--warmup", "0", option, str(out))
    assert invoke(*args).exit_code == 0
    assert invoke(*args).exit_code == 0  # kiln's own export of the same kind
    assert key in json.loads(out.read_text())
    out.write_text(json.dumps({"mine": 1}))
    assert_one_error_line(invoke(*args), str(out), "--force")
    assert json.loads(out.read_text()) == {"mine": 1}
    assert invoke(*args, "--force").exit_code == 0 and key in json.loads(out.read_text())


# -- modes, stale temp files, unwritable folders ------------------------------------------------------------
def test_plans_keep_the_umask_or_the_replaced_files_mode(model, tmp_path):
    out = tmp_path / "m.plan"
    old = os.umask(0o027)
    try:
        assert build(model, out).exit_code == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o640
        out.chmod(0o604)
        assert build(model, out).exit_code == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o604
    finally:
        os.umask(old)


def test_a_write_removes_stale_temp_files_of_its_own_only(plan, tmp_path):
    folder = tmp_path / "plans"
    folder.mkdir()
    stale, fresh, other = folder / ".kiln-dead.tmp", folder / ".kiln-live.tmp", folder / ".other.tmp"
    for p in (stale, fresh, other):
        p.write_bytes(b"x")
    (folder / ".kiln-link.tmp").symlink_to(other)
    old = time.time() - files.STALE_SECONDS - 60
    for p in (stale, other):
        os.utime(p, (old, old))
    kiln.load(plan).save(folder / "m.plan")
    assert sorted(p.name for p in folder.iterdir()) == [".kiln-link.tmp", ".kiln-live.tmp", ".other.tmp", "m.plan"]


def test_an_unwritable_folder_is_named_before_the_build(model, tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    real = os.access
    monkeypatch.setattr(files.os, "access", lambda p, mode: False if str(p) == str(folder) else real(p, mode))
    monkeypatch.setattr(kiln, "build", lambda *a, **k: pytest.fail("built before checking the output folder"))
    assert_one_error_line(build(model, folder / "m.plan"), str(folder / "m.plan"), "not writable")


def test_a_failed_write_names_the_users_path_not_the_temp_file(plan, tmp_path, monkeypatch):
    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.tempfile, "mkstemp", full)
    with pytest.raises(PlanError) as e:
        kiln.load(plan).save(tmp_path / "m.plan")
    assert str(tmp_path / "m.plan") in str(e.value) and ".tmp" not in str(e.value)
    assert "No space left" in str(e.value)


def test_symlinks_are_a_security_error_at_the_policy_level(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "absent")
    with pytest.raises(SecurityError, match="symbolic link"):
        files.write(tmp_path / "link", b"data", files.magic_kind("thing", "a.bin", b"T"))
    assert not (tmp_path / "absent").exists()


# -- the timing cache is kiln's own sqlite file ---------------------------------------------------------------
def _foreign_db(path, extra_sql=()):
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    db.execute("INSERT INTO invoices VALUES (1, 9.5)")
    for sql in extra_sql:
        db.execute(sql)
    db.commit()
    db.close()
    return path.read_bytes()


@pytest.mark.parametrize("extra", [(), ("CREATE TRIGGER t AFTER INSERT ON invoices BEGIN SELECT 1; END",)])
def test_timing_cache_refuses_another_programs_database_untouched(tmp_path, extra):
    path = tmp_path / "app.db"
    before = _foreign_db(path, extra)
    with pytest.raises(ConfigError, match="not a kiln timing cache.*new path"):
        TimingCache(path)
    assert path.read_bytes() == before
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["invoices"]
    db.close()


def test_timing_cache_marks_its_files_and_keeps_older_kiln_caches(tmp_path):
    TimingCache(tmp_path / "new.db")
    db = sqlite3.connect(tmp_path / "new.db")
    assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    db.close()
    legacy = tmp_path / "legacy.db"
    db = sqlite3.connect(legacy)
    db.execute("CREATE TABLE timings (env TEXT NOT NULL, signature TEXT NOT NULL, tactic TEXT NOT NULL, "
               "config TEXT NOT NULL, microseconds REAL, PRIMARY KEY (env, signature))")
    db.commit()
    db.close()
    assert len(TimingCache(legacy)) == 0  # a cache from before the marker: exactly kiln's table, adopted
    db = sqlite3.connect(tmp_path / "marked.db")
    db.execute(f"PRAGMA application_id = {APPLICATION_ID + 1}")
    db.execute("CREATE TABLE timings (env, signature, tactic, config, microseconds)")
    db.commit()
    db.close()
    with pytest.raises(ConfigError, match="not a kiln timing cache"):
        TimingCache(tmp_path / "marked.db")


# -- the other writers go through the same policy --------------------------------------------------------------
def test_conformance_out_refuses_a_foreign_file_before_running_the_suite(tmp_path, monkeypatch):
    import kiln.cli.conformance as cli_conformance

    monkeypatch.setattr(cli_conformance, "run_suite", lambda *a, **k: pytest.fail("ran before checking --out"))
    out = tmp_path / "README.md"
    out.write_bytes(FOREIGN)
    assert_one_error_line(invoke("conformance", "--device", "cpu", "--out", str(out)), str(out), "--force")
    assert out.read_bytes() == FOREIGN


def test_calibration_cache_never_writes_through_a_link(tmp_path):
    from kiln.quant.calib_cache import CalibrationCache

    victim = tmp_path / "victim"
    victim.write_bytes(FOREIGN)
    (tmp_path / "c.json").symlink_to(victim)
    with pytest.raises(SecurityError):
        CalibrationCache("entropy", 99.99, "0" * 64, 4, {}).write(tmp_path / "c.json")
    assert victim.read_bytes() == FOREIGN
    CalibrationCache("entropy", 99.99, "0" * 64, 4, {}).write(tmp_path / "new.json")
    CalibrationCache("minmax", 99.99, "0" * 64, 4, {}).write(tmp_path / "new.json")  # its own kind: replaced
    assert json.loads((tmp_path / "new.json").read_text())["calibrator"] == "minmax"
