"""`tf32(enabled)`, entered around every eager layer call: inside it cuBLAS and cuDNN TF32 follow `enabled`, cuDNN is
on, deterministic off and its search off (outside `cudnn_search`); every flag the caller had comes back on exit, after
an exception and from nested scopes."""

import pytest
import torch

from kiln.tactics.common import tf32

M, C = torch.backends.cuda.matmul, torch.backends.cudnn


def _flags():
    return (M.allow_tf32, C.enabled, C.benchmark, C.deterministic, C.allow_tf32)


@pytest.fixture
def user_flags():
    """The caller's own settings, unlike kiln's scope in every flag; put back after the test."""
    saved = _flags()
    M.allow_tf32, C.enabled, C.benchmark, C.deterministic, C.allow_tf32 = True, False, True, True, False
    yield _flags()
    M.allow_tf32, C.enabled, C.benchmark, C.deterministic, C.allow_tf32 = saved


@pytest.mark.parametrize("enabled", [False, True])
def test_scope_sets_and_restores(user_flags, enabled):
    with tf32(enabled):
        assert _flags() == (enabled, True, False, False, enabled)
    assert _flags() == user_flags


def test_restores_after_an_exception_and_from_nested_scopes(user_flags):
    with pytest.raises(ValueError):
        with tf32(False):
            with tf32(True):
                assert M.allow_tf32 and C.allow_tf32
            assert not M.allow_tf32 and not C.allow_tf32
            raise ValueError("inside")
    assert _flags() == user_flags
