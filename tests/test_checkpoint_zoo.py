"""Bit-for-bit continuation across libraries and policies: timm's optimizer factory and
cosine scheduler, a Hugging Face BERT with its warmup schedule, bf16 autocast, an applied
lr_find; and a save in a real Jupyter kernel resumed in a fresh process."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

import torchmagic
from checkpoint_helpers import assert_same, batches, state, structure, train

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


def _continue_both(saved_path, original, rebuild, go_on) -> tuple:
    """The notebook trains on after the save; a fresh build resumes and does the same."""
    model, opt, scheds = original
    go_on(model, opt, scheds)
    fresh = rebuild()
    tm = torchmagic.resume(saved_path, fresh[0], fresh[1], schedulers=fresh[2])
    go_on(*fresh)
    assert_same(structure(model, opt), structure(fresh[0], fresh[1]))
    assert_same(state(model, opt), state(fresh[0], fresh[1]))
    return fresh, tm


def test_timm_convnext_factory_groups_and_cosine(tmp_path):
    import timm
    from timm.optim import create_optimizer_v2
    from timm.scheduler import CosineLRScheduler

    def build():
        torch.manual_seed(0)
        model = timm.create_model("convnext_atto", pretrained=False, num_classes=10)
        opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
        return model, opt, [CosineLRScheduler(opt, t_initial=10, warmup_t=1, warmup_lr_init=1e-5)]

    data = batches(2, (2, 3, 32, 32), 5)
    model, opt, scheds = build()
    tm = torchmagic.Session(model, opt, schedulers=scheds)
    tm.freeze("stem", "stages.0-2")
    tm.replace_head("auto", 5)
    train(model, opt, data)
    scheds[0].step(1)
    tm.unfreeze("stages.2", lr=1e-4)  # a decay and a no-decay group
    assert len(opt.param_groups) == 4
    train(model, opt, data[:1])
    scheds[0].step(2)
    tm.save(tmp_path / "convnext.pt")

    def go_on(m, o, s):
        train(m, o, data)
        s[0].step(3)

    (fresh, fresh_opt, fresh_scheds), _ = _continue_both(
        tmp_path / "convnext.pt", (model, opt, scheds), build, go_on
    )
    assert fresh.num_classes == 5
    assert fresh_scheds[0].base_values == scheds[0].base_values
    decays = [g["weight_decay"] for g in fresh_opt.param_groups]
    assert decays == [g["weight_decay"] for g in opt.param_groups] and set(decays) == {0.0, 0.05}


def test_hf_bert_linear_warmup_and_labels(tmp_path):
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        get_linear_schedule_with_warmup,
    )

    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=3,
    )

    def build():
        torch.manual_seed(0)
        model = BertForSequenceClassification(config)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return model, opt, [get_linear_schedule_with_warmup(opt, 2, 20)]

    gen = torch.Generator().manual_seed(0)
    data = [
        (torch.randint(0, 50, (4, 8), generator=gen), torch.randint(0, 4, (4,), generator=gen))
        for _ in range(2)
    ]

    def logits(m, x):
        return m(input_ids=x).logits

    model, opt, scheds = build()
    tm = torchmagic.Session(model, opt, schedulers=scheds)
    tm.freeze("bert.embeddings", "bert.encoder.layer.0")
    tm.replace_head("auto", labels=["w", "x", "y", "z"])
    train(model, opt, data, scheds[0].step, logits)
    tm.unfreeze("bert.encoder.layer.0", lr=1e-4)
    train(model, opt, data[:1], scheds[0].step, logits)
    tm.save(tmp_path / "bert.pt")

    def go_on(m, o, s):
        train(m, o, data, s[0].step, logits)  # dropout: the restored RNG decides

    (fresh, _, fresh_scheds), _ = _continue_both(
        tmp_path / "bert.pt", (model, opt, scheds), build, go_on
    )
    assert fresh.num_labels == 4 and fresh.config.id2label == {0: "w", 1: "x", 2: "y", 3: "z"}
    assert len(fresh_scheds[0].lr_lambdas) == 2
    assert fresh_scheds[0].get_last_lr() == scheds[0].get_last_lr()


def _tiny():
    from test_checkpoint import build_net

    model, opt, sched = build_net()
    return model, opt, [sched]


def test_bf16_autocast_policy_and_steps(tmp_path):
    from test_checkpoint import loader

    def go_on_with(tm):
        def go_on(m, o, s):
            for x, y in loader():
                with tm.autocast():
                    loss = nn.functional.cross_entropy(m(x), y)
                tm.step(loss, o)
                s[0].step()

        return go_on

    model, opt, scheds = _tiny()
    tm = torchmagic.Session(model, opt, schedulers=scheds)
    tm.amp_on("bf16")
    tm.freeze("stem")
    go_on_with(tm)(model, opt, scheds)
    tm.save(tmp_path / "bf16.pt")
    go_on_with(tm)(model, opt, scheds)
    fresh = _tiny()
    resumed = torchmagic.resume(tmp_path / "bf16.pt", fresh[0], fresh[1], fresh[2])
    assert resumed.amp_status().enabled and resumed.amp_status().dtype == "bf16"
    go_on_with(resumed)(*fresh)
    assert_same(state(model, opt), state(fresh[0], fresh[1]))


def test_after_lr_find_apply(tmp_path):
    from test_checkpoint import loader

    model, opt, scheds = _tiny()
    tm = torchmagic.Session(model, opt, schedulers=scheds)
    tm.freeze("stem")
    found = tm.lr_find(loader(), start=1e-5, end=1.0, steps=40, apply=True)
    assert found.applied is not None
    tm.save(tmp_path / "lr.pt")

    def go_on(m, o, s):
        train(m, o, loader(), s[0].step)

    (fresh, fresh_opt, _), resumed = _continue_both(
        tmp_path / "lr.pt", (model, opt, scheds), _tiny, go_on
    )
    assert resumed.history()[-1].action == "set_lr"
    assert [g["initial_lr"] for g in fresh_opt.param_groups] == [
        g["initial_lr"] for g in opt.param_groups
    ]


def _run_notebook_module():
    spec = importlib.util.spec_from_file_location(
        "run_notebook", HERE.parent / "tools/run_notebook.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_saved_in_a_real_kernel_resumed_in_a_fresh_process(tmp_path, monkeypatch):
    """The issue's resnet18 + AdamW + cosine (freeze, head, unfreeze lr=) with the magics
    in a real Jupyter kernel; a fresh process resumes, and both train on identically."""
    src = str(Path(torchmagic.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", src)  # the kernel imports this tree's torchmagic
    ckpt, after_kernel, after_script = tmp_path / "nb.pt", tmp_path / "k.pt", tmp_path / "s.pt"
    common = (
        f"import sys, torch\nsys.path.insert(0, {str(HERE)!r})\n"
        "torch.set_num_threads(1)  # the same arithmetic in both processes\n"
        "from checkpoint_helpers import batches, build_resnet18, state, train\n"
        "data = batches(2, (2, 3, 32, 32), 5)\n"
    )
    cells = [
        "%load_ext torchmagic",
        common + "model, optimizer, scheduler = build_resnet18()",
        "%freeze model.layer1-3",
        "%replace_head fc 5",
        "train(model, optimizer, data, scheduler.step)",
        "%unfreeze layer3 lr=1e-4",
        "train(model, optimizer, data[:1], scheduler.step)",
        f"%tm save {ckpt}",
        "train(model, optimizer, data, scheduler.step)\n"
        f"torch.save(state(model, optimizer), {str(after_kernel)!r})",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbformat.write(nb, tmp_path / "save.ipynb")
    executed = _run_notebook_module().execute_notebook(tmp_path / "save.ipynb", echo=False)
    saved_output = executed.cells[7].outputs[0]["data"]
    assert "text/html" in saved_output and "%unfreeze layer3 lr=1e-4" in saved_output["text/plain"]
    script = tmp_path / "resume.py"
    script.write_text(
        common + "import torchmagic\n"
        "model, optimizer, scheduler = build_resnet18(seed=11)\n"
        f"tm = torchmagic.resume({str(ckpt)!r}, model, optimizer, [scheduler])\n"
        "assert len(tm.history()) == 3\n"
        "train(model, optimizer, data, scheduler.step)\n"
        f"torch.save(state(model, optimizer), {str(after_script)!r})\n"
    )
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same(
        torch.load(after_kernel, weights_only=True), torch.load(after_script, weights_only=True)
    )
