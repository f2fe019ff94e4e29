"""Reference implementations of the spectral kinds: DFT, STFT, the window functions, MelWeightMatrix.

Complex values are ONNX-style real tensors with a trailing dimension of 2 (real, imaginary);
a trailing dimension of 1 holds a real signal. Half-precision inputs are transformed in fp32.
"""

from __future__ import annotations

import math

import torch

from kiln.kinds.registry import DTYPE, INT, kind


def _signal(x: torch.Tensor) -> torch.Tensor:
    """[..., 1] real or [..., 2] complex → a real or complex torch tensor without the trailing dim."""
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()
    return torch.view_as_complex(x.contiguous()) if x.shape[-1] == 2 else x[..., 0]


def _onnx_complex(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A real or complex result → ONNX layout ([..., 1] or [..., 2]) in `dtype`."""
    out = torch.view_as_real(y.resolve_conj()) if y.is_complex() else y.unsqueeze(-1)
    return out.to(dtype)


def _forward(sig: torch.Tensor, n: int, dim: int, onesided: bool) -> torch.Tensor:
    """FFT of `n` points along `dim`; one-sided keeps the n//2 + 1 non-redundant bins."""
    if onesided and not sig.is_complex():
        return torch.fft.rfft(sig, n, dim=dim)
    y = torch.fft.fft(sig, n, dim=dim)
    return y.narrow(dim, 0, n // 2 + 1) if onesided else y


@kind("DFT", attrs={"axis": INT.req, "inverse": INT.req, "onesided": INT.req})
def dft(inputs, attrs):
    """inputs: signal, dft_length?, axis? (opset 20; the `axis` attribute before it)."""
    x, length, axis = (list(inputs) + [None, None])[:3]
    dim = (int(axis) if axis is not None else attrs["axis"]) % x.dim()
    sig = _signal(x)
    inverse, onesided = bool(attrs["inverse"]), bool(attrs["onesided"])
    if length is not None:
        n = int(length)
    else:
        n = 2 * (sig.shape[dim] - 1) if inverse and onesided else sig.shape[dim]
    if not inverse:
        y = _forward(sig, n, dim, onesided)
    elif onesided:
        y = torch.fft.irfft(sig, n, dim=dim)
    else:
        y = torch.fft.ifft(sig, n, dim=dim)
    return _onnx_complex(y, x.dtype)


@kind("STFT", attrs={"onesided": INT.req})
def stft(inputs, attrs):
    """inputs: signal [batch, length, 1|2], frame_step, window?, frame_length? → [batch, frames, bins, 2]."""
    x, step, window, length = (list(inputs) + [None, None])[:4]
    sig = _signal(x)
    if length is not None:
        n = int(length)
    else:
        n = window.shape[0] if window is not None else sig.shape[1]
    if window is not None and window.shape[0] != n:
        raise ValueError(f"STFT window has {window.shape[0]} samples but frame_length is {n}")
    frames = sig.unfold(1, n, int(step))
    if window is not None:
        frames = frames * window.to(frames.real.dtype)
    return _onnx_complex(_forward(frames, n, -1, bool(attrs["onesided"])), x.dtype)


def _window(coefficients: tuple[float, ...]):
    """A generalized cosine window: sum_k (-1)^k a_k cos(2 pi k n / N), computed in fp64."""

    def ref(inputs, attrs):
        size = int(inputs[0])
        n = torch.arange(size, dtype=torch.float64, device=inputs[0].device)
        period = size if attrs["periodic"] else size - 1
        w = torch.zeros_like(n)
        for k, a in enumerate(coefficients):
            w += (-1) ** k * a * torch.cos(2 * math.pi * k * n / period)
        return w.to(attrs["output_datatype"].torch)

    return ref


kind("HannWindow", attrs={"output_datatype": DTYPE.req, "periodic": INT.req})(_window((0.5, 0.5)))
kind("HammingWindow", attrs={"output_datatype": DTYPE.req, "periodic": INT.req})(_window((25 / 46, 21 / 46)))
kind("BlackmanWindow", attrs={"output_datatype": DTYPE.req, "periodic": INT.req})(_window((0.42, 0.5, 0.08)))


@kind("MelWeightMatrix", attrs={"output_datatype": DTYPE.req})
def mel_weight_matrix(inputs, attrs):
    """[dft_length//2 + 1, num_mel_bins] triangular filters, equally spaced on the mel scale."""
    mel_bins, dft_length, rate, low, high = (int(inputs[0]), int(inputs[1]), int(inputs[2]),
                                             float(inputs[3]), float(inputs[4]))
    dev = inputs[0].device

    def mel(hz):
        return 2595 * math.log10(1 + hz / 700)

    edges = torch.arange(mel_bins + 2, dtype=torch.float64, device=dev)
    edges = edges * ((mel(high) - mel(low)) / (mel_bins + 2)) + mel(low)
    hz = 700 * torch.expm1(edges / 2595 * math.log(10))
    bins = torch.floor((dft_length + 1) * hz / rate)
    left, center, right = bins[:-2], bins[1:-1], bins[2:]
    j = torch.arange(dft_length // 2 + 1, dtype=torch.float64, device=dev)[:, None]
    rising = torch.where(center > left, (j - left) / (center - left).clamp(min=1), 1.0)
    falling = (right - j) / (right - center).clamp(min=1)
    out = torch.where((j >= center) & (j < right), falling, torch.where((j >= left) & (j <= center), rising, 0.0))
    return out.to(attrs["output_datatype"].torch)
