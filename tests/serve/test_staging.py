"""A context's staging block: a batch's arrays carved out of one reused host block, aligned and apart."""

from __future__ import annotations

import itertools

import numpy as np

from kiln.serve.staging import ALIGN, SMALL_BATCH_BYTES, Staging, gather, stageable


def test_arrays_are_aligned_disjoint_views_of_one_block_that_grows_only_when_needed():
    s = Staging(pinned=False)
    specs = {"x": ((4, 3, 5), np.dtype(np.float32)), "ids": ((4, 7), np.dtype(np.int64)),
             "flag": ((4,), np.dtype(np.bool_)), "empty": ((4, 0), np.dtype(np.float16))}
    a = s.arrays(specs)
    assert {k: (v.shape, v.dtype) for k, v in a.items()} == specs
    starts = {k: v.__array_interface__["data"][0] - s.block.__array_interface__["data"][0] for k, v in a.items()}
    assert all(at % ALIGN == 0 for at in starts.values())
    for k, v in a.items():  # writing one array leaves the others as they were
        v[...] = 1
    a["x"][...] = 7
    assert (a["ids"] == 1).all() and a["flag"].all() and (a["x"] == 7).all()
    block = s.block
    small = s.arrays({"x": ((1, 3, 5), np.dtype(np.float32))})
    assert s.block is block and np.shares_memory(small["x"], block)  # a smaller batch reuses the block
    s.arrays({"x": ((64, 3, 5), np.dtype(np.float32))})
    assert s.block is not block and s.block.nbytes >= 64 * 15 * 4


def test_only_numeric_and_bool_inputs_are_staged():
    assert stageable(np.dtype(np.float16)) and stageable(np.dtype(np.int8)) and stageable(np.dtype(bool))
    assert not stageable(np.dtype(object)) and not stageable(np.dtype("U4"))


def test_gather_copies_read_only_parts_of_any_numeric_dtype_into_leading_rows():
    for dtype, width in itertools.product((np.float32, np.float16, np.int64, np.int8, np.uint8, np.bool_),
                                          (3, SMALL_BATCH_BYTES)):  # numpy's way and torch's
        parts = [np.frombuffer((np.arange(n * width) % 100).astype(dtype).tobytes(), dtype).reshape(n, width)
                 for n in (1, 2, 4)]
        assert not parts[0].flags.writeable
        dest = np.full((8, width), 5, dtype)
        gather(parts, dest)
        np.testing.assert_array_equal(dest[:7], np.concatenate(parts))
        assert (dest[7] == np.array(5, dtype)).all()  # rows past the parts are left alone
