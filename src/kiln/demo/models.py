"""The demo models, in plain torch: a small ResNet-style CNN and a small transformer encoder."""

from __future__ import annotations

import math

import torch
from torch import nn


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout))


class BasicBlock(nn.Module):
    """conv-bn-relu, conv-bn, plus the (projected) input, relu: ResNet-18's block."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.body = nn.Sequential(_conv_bn(cin, cout, 3, stride), nn.ReLU(), _conv_bn(cout, cout, 3))
        self.skip = _conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


class TinyResNet(nn.Module):
    """Three stages of basic blocks on 32×32 images, global average pooling, a linear classifier."""

    def __init__(self, classes: int = 10, widths=(16, 32, 64)):
        super().__init__()
        layers, cin = [_conv_bn(3, widths[0], 3), nn.ReLU()], widths[0]
        for i, w in enumerate(widths):
            layers.append(BasicBlock(cin, w, 1 if i == 0 else 2))
            cin = w
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


class EncoderLayer(nn.Module):
    """Post-norm transformer encoder layer (BERT's): attention, add & norm, GELU MLP, add & norm."""

    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.norm2 = nn.LayerNorm(dim)

    def attention(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads), dim=-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(b, s, d))

    def forward(self, x):
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.mlp(x))


class TinyEncoder(nn.Module):
    """Token and position embeddings, two encoder layers, mean pooling, a linear classifier."""

    def __init__(self, vocab: int = 1000, seq: int = 32, dim: int = 64, heads: int = 4, layers: int = 2,
                 classes: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        self.layers = nn.Sequential(*(EncoderLayer(dim, heads, 2 * dim) for _ in range(layers)))
        self.head = nn.Linear(dim, classes)

    def forward(self, ids):
        return self.head(self.layers(self.embed(ids) + self.position).mean(dim=1))


def randomize_batchnorm(model: nn.Module) -> nn.Module:
    """Give every BatchNorm non-trivial statistics, so that folding it into convolutions is really exercised."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return model.eval()
