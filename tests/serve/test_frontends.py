"""`kiln serve --frontends N`: front-end processes hand requests to one engine process over the link (a Unix socket,
tensors in shared memory slots or inline); in-process for the link's paths, then the real processes."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
from test_http import MODEL, affine_repository, serving, stop
from test_workers import _assert_summed, _http_stats, _requests_counted

from kiln.serve.errors import BadRequest, InferenceFailed, ModelNotFound, ModelNotReady
from kiln.serve import link
from kiln.serve.link import LinkSpec, memfd
from kiln.serve.link_server import LinkServer
from kiln.serve.linked import STATE_REFRESH_S, LinkedRepository
from kiln.serve.repository import ModelRepository


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return affine_repository(tmp_path_factory.mktemp("frontends") / "models")


def test_tensors_inline_round_trip_every_shape_and_dtype():
    arrays = {"scalar": np.array(1.5, np.float32), "empty": np.zeros((3, 0), np.float32),
              "half": np.arange(4, dtype=np.float16).reshape(2, 2), "ids": np.array([[7, -1]], np.int64)}
    entries, end = link.describe(arrays, 0)
    assert all(at % link.ALIGN == 0 for *_, at in entries) and end % link.ALIGN == 0
    buffers = link.frame({"op": "test"}, link.inline(entries, arrays, 0))
    payload = b"".join(bytes(b) for b in buffers[2:])
    got = link.read(payload, entries)
    for name, a in arrays.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape
        np.testing.assert_array_equal(got[name], a)


async def _linked(root, sock: str, slots: int, slot_bytes: int, regions=None):
    """An engine-side repository and LinkServer (serving the shared memory `regions`, if given), and a front end's
    LinkedRepository over them (one process)."""
    engine = ModelRepository(root, device="cpu")
    engine.start()
    fd = memfd("test-link", slots * slot_bytes)
    server = LinkServer(engine, LinkSpec(sock, (fd,), slots, slot_bytes), regions)
    await server.start()
    front = LinkedRepository(root, LinkSpec(sock, (fd,), slots, slot_bytes, frontend=0))
    await front.start()
    return engine, server, front


async def _close(engine, server, front) -> None:
    await front.close()
    await engine.close()
    await server.close()


def test_the_link_answers_through_slots_and_inline_exactly(repo, tmp_path):
    async def main():
        parts = await _linked(repo, str(tmp_path / "e.sock"), slots=2, slot_bytes=256)
        engine, server, front = parts
        try:
            model = front.get(MODEL)
            assert model.metadata() == engine.get(MODEL).metadata() and model.config.input[0].name == "x"
            # 2x4 fits a slot with its output; 16x4 fits the slot, its output comes inline; 64x4 goes inline;
            # twelve at once take both slots and send the others inline
            sizes = [2, 16, 64, *range(1, 13)]
            xs = [np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32) for n in sizes]
            got = await asyncio.gather(*(model.infer({"x": x}) for x in xs))
            for x, y in zip(xs, got):
                np.testing.assert_array_equal(y["y"], x * 2 + 1)
            assert sorted(front.link.free) == [0, 1]  # every slot came back
            encoded = await model.infer({"x": xs[0]}, ["y"], encode=lambda out: sorted(out))
            assert encoded == ["y"]
            with pytest.raises(BadRequest, match=r"shape \[2, 5\]") as e:
                await model.infer({"x": np.ones((2, 5), np.float32)})
            assert e.value.http_status == 400
            with pytest.raises(ModelNotFound):
                front.get("nope")
            await front._pull()  # the engine's statistics, as the refresh brings them
            assert front.get(MODEL).statistics() == engine.get(MODEL).statistics()
            assert front.get(MODEL).statistics()["inference_stats"]["success"]["count"] == len(sizes) + 1
            assert front.index() == engine.index()
        finally:
            await _close(*parts)

    asyncio.run(main())


def test_a_cancelled_request_is_dropped_by_the_engine_and_frees_its_slot(repo, tmp_path):
    (repo / MODEL / "config.toml").write_text("[dynamic_batching]\npreferred_batch_size = [64]\n"
                                              "max_queue_delay_microseconds = 3000000\n")  # a request waits 3 s

    async def main():
        parts = await _linked(repo, str(tmp_path / "e.sock"), slots=2, slot_bytes=4096)
        engine, server, front = parts
        try:
            task = asyncio.create_task(front.get(MODEL).infer({"x": np.ones((1, 4), np.float32)}))
            await asyncio.sleep(0.2)
            assert len(front.link.free) == 1  # in the engine's queue
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            loop = asyncio.get_running_loop()
            start = loop.time()
            while len(front.link.free) < 2:  # the engine's ClientGone reply frees the slot
                assert loop.time() - start < 1.5, "the engine kept the cancelled request queued"
                await asyncio.sleep(0.01)
            stats = engine.get(MODEL).statistics()["inference_stats"]
            assert stats["fail"]["count"] == 1 and stats["success"]["count"] == 0
        finally:
            await _close(*parts)

    try:
        asyncio.run(main())
    finally:
        (repo / MODEL / "config.toml").unlink()


def test_a_front_end_whose_engine_is_gone_fails_its_requests(repo, tmp_path):
    async def main():
        engine, server, front = await _linked(repo, str(tmp_path / "e.sock"), slots=2, slot_bytes=4096)
        try:
            await server.close()  # the engine's end goes away
            await asyncio.sleep(0.1)
            with pytest.raises((InferenceFailed, ModelNotReady), match="engine process is gone"):
                await front.get(MODEL).infer({"x": np.ones((1, 4), np.float32)})
            assert sorted(front.link.free) == [0, 1]
        finally:
            await front.close()
            await engine.close()

    asyncio.run(main())


def _frontend_seconds(port: int) -> dict[str, float]:
    """The front ends' request and link histograms' counts and sums for MODEL, summed over the front ends."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for name, value in re.findall(r'(kiln_frontend_(?:request|link)_seconds_(?:count|sum))\{model="%s"\} (\S+)' % MODEL,
                                  text):
        out[name] = out.get(name, 0.0) + float(value)
    return out


def test_two_front_ends_and_an_engine_serve_http_grpc_metrics_and_statistics(repo):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        metrics = probe.getsockname()[1]
    with serving(repo, "--frontends", "2", "--metrics-port", str(metrics)) as (url, grpc_url, proc, log):
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        for module, where in ((httpclient, url), (grpcclient, grpc_url)):
            for _ in range(16):  # a new connection each time: the kernel spreads them over the front ends
                client = module.InferenceServerClient(where)
                inp = module.InferInput("x", [2, 4], "FP32")
                inp.set_data_from_numpy(x)
                np.testing.assert_array_equal(client.infer(MODEL, [inp]).as_numpy("y"), x * 2 + 1)
                client.close()
        assert _requests_counted(metrics) == 32  # the engine process counts every front end's requests
        front = _frontend_seconds(metrics)  # each front end times its requests and their link round trips
        assert front["kiln_frontend_request_seconds_count"] == front["kiln_frontend_link_seconds_count"] == 32
        assert 0 < front["kiln_frontend_link_seconds_sum"] <= front["kiln_frontend_request_seconds_sum"]
        import time

        time.sleep(3 * STATE_REFRESH_S)
        for _ in range(4):  # whichever front end answers: the engine's statistics
            _assert_summed(_http_stats(url, f"/v2/models/{MODEL}/stats"), 32, 2)
            client = grpcclient.InferenceServerClient(grpc_url)
            _assert_summed(client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0], 32, 2)
            client.close()
        with pytest.raises(InferenceServerException, match="--frontends"):
            httpclient.InferenceServerClient(url).unload_model(MODEL)
    assert proc.returncode == 0, log.read_text()[-4000:]
    text = log.read_text()
    assert "engine: stopped" in text and len(re.findall(r"front end \d: stopped", text)) == 2, text[-3000:]
    assert len(re.findall(r"engine: model affine version 1: READY", text)) == 1  # one engine copy


def test_an_engine_that_dies_stops_the_server(repo):
    with serving(repo, "--frontends", "2", grpc=False) as (url, _, proc, log):
        engine = int(re.search(r"pids (\d+)", log.read_text()).group(1))
        subprocess.run(["kill", "-KILL", str(engine)], check=True)
        assert proc.wait(timeout=30) == 128 + signal.SIGKILL
    assert "stopping the others" in log.read_text()


@pytest.mark.parametrize("extra, message", [(["--workers", "2"], "choose one")])
def test_frontends_refuse_what_they_cannot_serve(repo, extra, message):
    r = subprocess.run([sys.executable, "-m", "kiln", "serve", str(repo), "--frontends", "2", *extra],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_shared_memory_regions_live_in_the_engine_process(repo, tmp_path):
    """Under --frontends a front end's registry forwards registration and status to the engine process, sends inputs
    in regions as references, and the engine reads them there and writes the outputs bound for regions: a system
    region and a (stand-in) CUDA region, round trip exact; errors cross the link by class."""
    import base64
    import os

    from test_cuda_shared_memory import FakeDevice

    from kiln.serve.errors import AlreadyExists, RegionNotFound
    from kiln.serve.linked import LinkedRegions, RegionInput
    from kiln.serve.shared_memory import CUDA, SharedMemoryRegistry, TensorRef

    key = f"kiln_test_link_{os.getpid()}"
    with open(f"/dev/shm/{key}", "wb") as f:
        f.truncate(256)
    device = FakeDevice(gpu=256)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)

    async def main():
        parts = await _linked(repo, str(tmp_path / "e.sock"), 2, 4096, SharedMemoryRegistry(cuda=device))
        engine, server, front = parts
        regions = LinkedRegions(front, cuda=True)
        try:
            await regions.register("sys", f"/{key}", 0, 256)
            await regions.register_cuda("dev", device.handle("gpu"), 0, 256)
            assert await regions.status() == [{"name": "sys", "key": f"/{key}", "offset": 0, "byte_size": 256}]
            assert await regions.status("dev", CUDA) == [{"name": "dev", "device_id": 0, "byte_size": 256}]
            with pytest.raises(AlreadyExists):
                await regions.register("dev", f"/{key}", 0, 16)
            with pytest.raises(RegionNotFound):
                await regions.status("nope")
            with open(f"/dev/shm/{key}", "r+b") as f:
                f.write(x.tobytes())
            device.memory("gpu")[:32] = torch.from_numpy((x + 10).view(np.uint8).reshape(-1).copy())
            model = front.get(MODEL)
            for name, want in (("sys", x), ("dev", x + 10)):
                ref = TensorRef(name, 0, 32)
                inp = regions.read("input 'x'", ref, "FP32", np.float32, [2, 4])
                assert isinstance(inp, RegionInput)
                out_ref = TensorRef(name, 64, 32)
                regions.check("output 'y'", out_ref)
                got = await model.infer({"x": inp}, ["y"], shm_outputs={"y": out_ref})
                assert got["y"].shape == (2, 4) and got["y"].dtype == np.float32  # its dtype and shape only
                if name == "sys":
                    written = np.fromfile(f"/dev/shm/{key}", np.float32, 8, offset=64).reshape(2, 4)
                else:
                    written = device.memory("gpu")[64:96].numpy().view(np.float32).reshape(2, 4)
                np.testing.assert_array_equal(written, want * 2 + 1)
            with pytest.raises(RegionNotFound, match="'gone'"):
                await model.infer({"x": RegionInput(TensorRef("gone", 0, 32), "FP32", np.dtype(np.float32),
                                                    [2, 4])})
            await regions.unregister("dev", CUDA)
            await regions.unregister()
            assert await regions.status() == [] and await regions.status(kind=CUDA) == []
            assert base64.b64encode(device.handle("gpu"))  # the handle crossed the link as base64 and back
            assert device.opened == [(0, 256)]
        finally:
            await _close(*parts)

    try:
        asyncio.run(main())
    finally:
        os.unlink(f"/dev/shm/{key}")


def test_frontends_serve_system_shared_memory(repo):
    """A real `kiln serve --frontends 2 --shared-memory`: a region registered through one connection serves
    requests over HTTP and gRPC, whichever front end takes them."""
    shm = pytest.importorskip("tritonclient.utils.shared_memory")
    import os

    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    key = f"/kiln_test_fe_{os.getpid()}"
    handle = shm.create_shared_memory_region("fe", key, 64, create_only=True)
    try:
        shm.set_shared_memory_region(handle, [x])
        with serving(repo, "--frontends", "2", "--shared-memory") as (url, grpc_url, _, log):
            httpclient.InferenceServerClient(url).register_system_shared_memory("fe", key, 64)
            for module, target in [(httpclient, url), (grpcclient, grpc_url)] * 3:  # new connections each time
                c = module.InferenceServerClient(target)
                assert "system_shared_memory" in (c.get_server_metadata(as_json=True) if module is grpcclient
                                                  else c.get_server_metadata())["extensions"]
                inp = module.InferInput("x", [2, 4], "FP32")
                inp.set_shared_memory("fe", 32)
                out = module.InferRequestedOutput("y")
                out.set_shared_memory("fe", 32, 32)
                c.infer(MODEL, [inp], outputs=[out])
                got = shm.get_contents_as_numpy(handle, np.float32, [4, 4])
                np.testing.assert_array_equal(got[2:], x * 2 + 1)
                shm.set_shared_memory_region(handle, [np.zeros_like(x)], offset=32)
                c.close()
            httpclient.InferenceServerClient(url).unregister_system_shared_memory()
            assert grpcclient.InferenceServerClient(grpc_url).get_system_shared_memory_status(as_json=True) == {}
    finally:
        shm.destroy_shared_memory_region(handle)


def test_a_front_end_still_waiting_for_its_engine_stops_on_sigterm(repo, tmp_path):
    """A front end connects to the engine process after starting (the engine may be building models); if the engine
    is gone by then (killed while this front end started, as under CPU load), SIGTERM must still stop it at once."""
    import os
    import time

    fd = memfd("test-link", 4096)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "kiln", "serve", str(repo), "--device", "cpu", "--http-port",
                                 "-1", "--grpc-port", "-1", "--metrics-port", "-1", "--worker-index", "1", "--link",
                                 str(tmp_path / "no-engine.sock"), "--link-fds", str(fd), "--frontend-index", "0"],
                                pass_fds=[fd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(4)  # imported and waiting for the engine's socket
        assert proc.poll() is None
        start = time.monotonic()
        stop(proc)  # SIGTERM, then a kill after 15 s
        assert proc.returncode != -signal.SIGKILL, "the front end did not stop on SIGTERM while waiting for its engine"
        assert time.monotonic() - start < 10 and "Traceback" not in proc.stderr.read()
    finally:
        os.close(fd)
