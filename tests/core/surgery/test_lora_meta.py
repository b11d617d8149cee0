"""A Llama-3-70B-shaped model on the meta device (hidden 8192, 80 layers): ``%freeze``,
``%lora q_proj,v_proj r=16``, ``%summary`` and ``%tm undo`` hold no weights in memory
(the adapters are made on the meta device too) and leave the structure peft would.
Memory and structure only; their times are bench/lora_llm.py's."""

from __future__ import annotations

import os

import pytest
import torch

from torchmagic.core.integrations import peft as peft_integration

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

MiB = 2**20
HIDDEN, KV, LAYERS, R = 8192, 1024, 80, 16


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_70b_shaped_model_on_meta_is_adapted_and_undone_in_little_memory(ip):
    config = transformers.LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=28672,
        num_hidden_layers=LAYERS,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    names = [n for n, _ in model.named_parameters()]
    ip.user_ns["model"] = model
    start = rss()
    ip.run_line_magic("freeze", "model")
    ip.run_line_magic("lora", f"q_proj,v_proj r={R}")
    ip.run_line_magic("summary", "")
    grown = rss() - start
    # the bound is 300 MiB; adapters made on the CPU and then moved (peft's way)
    # grew it by 124 MiB, made on the meta device by about 5
    assert grown < 64 * MiB, f"{grown / MiB:.0f} MiB"
    layers = peft_integration.lora_layers(model)
    assert len(layers) == 2 * LAYERS
    adapters = peft_integration.adapters_of(model)
    assert all(p.is_meta and p.requires_grad for p in adapters)
    # q_proj: A hidden x r, B r x hidden; v_proj: A hidden x r, B r x kv
    assert sum(p.numel() for p in adapters) == LAYERS * R * (HIDDEN * 3 + KV)
    assert [p for p in model.parameters() if p.requires_grad] == adapters
    ip.run_line_magic("tm", "undo")  # the lora
    assert not peft_integration.lora_layers(model)
    assert [n for n, _ in model.named_parameters()] == names
    assert not any(p.requires_grad for p in model.parameters())
    ip.run_line_magic("tm", "undo")  # the freeze
    assert all(p.requires_grad for p in model.parameters())
    assert rss() - start < 300 * MiB
