"""The model suite: how to make each model (random weights), its inputs, and its ONNX export (cached)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from tests.models.export import export  # the test models; run from the repository root (python -m benchmarks.…)

OPSET = 18
VERSION = 2  # bump when a model or its export changes: cached file names carry it
EXPORT_BATCH = 2  # traced at batch 2 (not 1) so no batch dimension is specialized away


@dataclass(frozen=True)
class Made:
    """A model in fp32 on the CPU, where it came from, and whether a fallback stood in for the real thing."""

    module: torch.nn.Module
    source: str
    fallback: str | None = None


@dataclass(frozen=True)
class Spec:
    """One suite model: `make(size)` builds it, `size` is the image side or the sequence length."""

    name: str
    task: str  # "image" or "text"
    make: Callable[[int], Made]
    default_size: int
    channels_last: bool = False

    @property
    def input_names(self) -> list[str]:
        return ["input"] if self.task == "image" else ["input_ids", "attention_mask", "token_type_ids"]

    @property
    def output_names(self) -> list[str]:
        return ["logits"] if self.task == "image" else ["last_hidden_state", "pooler_output"]

    def inputs(self, batch: int, size: int, seed: int = 0) -> dict[str, torch.Tensor]:
        """Random images, or random token ids with a full attention mask, on the CPU."""
        g = torch.Generator().manual_seed(seed)
        if self.task == "image":
            return {"input": torch.randn(batch, 3, size, size, generator=g)}
        ids = torch.randint(0, 30000, (batch, size), generator=g)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


def _torchvision(name: str, fallback: Callable[[int], torch.nn.Module]) -> Callable[[int], Made]:
    """torchvision's model with random weights, or the plain-torch copy in tests/models/vision.py without it."""
    def make(size: int) -> Made:
        kw = {"image_size": size} if name.startswith("vit") else {}
        try:
            import torchvision
        except ImportError as e:
            return Made(fallback(size), f"tests/models/vision.py (torch {torch.__version__})",
                        f"torchvision is not importable ({e}); used the plain-torch copy in tests/models/vision.py")
        model = getattr(torchvision.models, name)(weights=None, **kw)
        return Made(realistic(model, size), f"torchvision {torchvision.__version__}")
    return make


def realistic(model: torch.nn.Module, size: int) -> torch.nn.Module:
    """Random weights with trained-like activation scales: BatchNorm statistics calibrated on random images
    (untrained statistics let MobileNetV2's activations vanish below fp16's range) and no zero-initialized
    classifier (torchvision's ViT head), so accuracy checks compare real signals."""
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and not m.weight.any():
            torch.nn.init.normal_(m.weight, std=0.02)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if bns:
        for m in bns:
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the calibration batches
        model.train()
        with torch.no_grad():
            for _ in range(4):
                model(torch.randn(8, 3, size, size))
    return model.eval()


def _bert(**cfg) -> Callable[[int], Made]:
    """A transformers BertModel with random weights (BertConfig defaults are BERT-base)."""
    def make(size: int) -> Made:
        import transformers
        from transformers import BertConfig, BertModel

        from tests.models.text import LastHidden

        model = BertModel(BertConfig(**cfg), add_pooling_layer=True)
        return Made(LastHidden(model), f"transformers {transformers.__version__}")
    return make


def _vision_fallback(cls: str) -> Callable[[int], torch.nn.Module]:
    def make(size: int) -> torch.nn.Module:
        from tests.models import vision

        return getattr(vision, cls)(image_size=size) if cls == "ViT" else getattr(vision, cls)()
    return make


SPECS = {s.name: s for s in (
    Spec("resnet50", "image", _torchvision("resnet50", _vision_fallback("ResNet50")), 224, channels_last=True),
    Spec("mobilenet_v2", "image", _torchvision("mobilenet_v2", _vision_fallback("MobileNetV2")), 224,
         channels_last=True),
    Spec("vit_b_16", "image", _torchvision("vit_b_16", _vision_fallback("ViT")), 224),
    Spec("bert", "text", _bert(), 128),
    Spec("minilm", "text", _bert(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                 intermediate_size=1536), 128),
)}


def instantiate(spec: Spec, size: int) -> Made:
    """The model in eval mode with seeded random weights: the same weights on every call in every process."""
    torch.manual_seed(0)
    made = spec.make(size)
    made.module.eval()
    return made


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def onnx_file(spec: Spec, made: Made, size: int, cache: Path, dynamic_seq: bool = False) -> tuple[Path, bool]:
    """The model's ONNX export in `cache` (dynamic batch, opset 18), made on first use; (path, was it cached).

    `dynamic_seq`: a text model's sequence axis is dynamic too (traced at `size`; a file of its own)."""
    dynamic_seq = dynamic_seq and spec.task == "text"
    path = cache / f"{spec.name}-{size}{'-dynseq' if dynamic_seq else ''}-{_slug(made.source)}-v{VERSION}.onnx"
    if path.is_file():
        return path, True
    cache.mkdir(parents=True, exist_ok=True)
    example = spec.inputs(EXPORT_BATCH, size)
    if spec.task == "text":  # a padded sequence, so the traced graph keeps the attention-mask path
        example["attention_mask"][1, size // 2:] = 0
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    axes = {n: {0: "batch"} for n in spec.input_names + spec.output_names}
    if dynamic_seq:  # every input and last_hidden_state are [batch, seq, ...]; pooler_output is [batch, hidden]
        axes |= {n: {0: "batch", 1: "seq"} for n in [*spec.input_names, spec.output_names[0]]}
    export(made.module, tuple(example.values()), tmp, dynamo=False, input_names=spec.input_names,
           output_names=spec.output_names, dynamic_axes=axes, opset=OPSET)
    os.replace(tmp, path)
    return path, False
