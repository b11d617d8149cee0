"""Bit-for-bit continuation, saved with the magics in a real Jupyter kernel and resumed in
a fresh process, for the issue's five cases: resnet18 + AdamW + cosine; timm's convnext with
create_optimizer_v2's groups and timm's cosine; a Hugging Face BERT with its linear warmup
and new labels; bf16 autocast on; after an applied %lr_find."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

import torchmagic
from checkpoint_helpers import assert_same
from paths import TESTS
from real_kernel import execute_notebook

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent
CASES = ("resnet18", "convnext", "bert", "lr_find", "bf16")


def _kernel_cells(saved: dict, after: dict) -> list[str]:
    """The notebook: each case built, edited with the magics, trained, saved with %tm save,
    trained on, and everything it must continue to written to ``after``."""
    return [
        "%load_ext torchmagic",
        "tm = torchmagic.notebook_session()",
        "model, optimizer, scheduler = build_resnet18()",
        "%freeze model.layer1-3",
        "%replace_head fc 5",
        "train(model, optimizer, images, scheduler.step)",
        "%unfreeze layer3 lr=1e-4",
        "train(model, optimizer, images[:1], scheduler.step)",
        f"%tm save {saved['resnet18']}",
        "train(model, optimizer, images, scheduler.step)\n"
        f"torch.save(everything(model, optimizer, scheduler), {str(after['resnet18'])!r})",
        "cnx, cnx_opt, cnx_sched = build_convnext()",
        "%tm use cnx",
        "%freeze stem stages.0-2",
        "%replace_head auto 5",
        "train(cnx, cnx_opt, images); cnx_sched.step(1)",
        "%unfreeze stages.2 lr=1e-4",
        "assert len(cnx_opt.param_groups) == 4  # a decay and a no-decay group each\n"
        "train(cnx, cnx_opt, images[:1]); cnx_sched.step(2)",
        f"%tm save {saved['convnext']}",
        "train(cnx, cnx_opt, images); cnx_sched.step(3)\n"
        f"torch.save(everything(cnx, cnx_opt, cnx_sched), {str(after['convnext'])!r})",
        "clf, clf_opt, clf_sched = build_bert()",
        "%tm use clf",
        "%freeze bert.embeddings bert.encoder.layer.0",
        "%replace_head auto labels=w,x,y,z",
        "train(clf, clf_opt, tokens, clf_sched.step, logits)",
        "%unfreeze bert.encoder.layer.0 lr=1e-4",
        "train(clf, clf_opt, tokens[:1], clf_sched.step, logits)",
        f"%tm save {saved['bert']}",
        "train(clf, clf_opt, tokens, clf_sched.step, logits)  # dropout: the RNG decides\n"
        f"torch.save(everything(clf, clf_opt, clf_sched), {str(after['bert'])!r})",
        "net, net_opt, net_sched = build_net()\ntrain_loader = loader()",
        "%tm use net",
        "%freeze stem",
        "%lr_find net train_loader --start 1e-5 --end 1.0 --steps 40 --apply",
        f"%tm save {saved['lr_find']}",
        "train(net, net_opt, loader(), net_sched.step)\n"
        f"torch.save(everything(net, net_opt, net_sched), {str(after['lr_find'])!r})",
        "small, small_opt, small_sched = build_net(seed=3)",
        "%tm use small",
        "%amp on bf16",
        "%freeze stem",
        "amp_train(tm, small, small_opt, loader(), small_sched)",
        f"%tm save {saved['bf16']}",
        "amp_train(tm, small, small_opt, loader(), small_sched)\n"
        f"torch.save(everything(small, small_opt, small_sched), {str(after['bf16'])!r})",
    ]


def _resume_script(saved: dict, after: dict) -> str:
    """A fresh process: each case built as the notebook first built it (other seeds),
    resumed, checked and trained on exactly as the notebook went on."""
    return (
        "import torchmagic\n"
        "model, optimizer, scheduler = build_resnet18(seed=11)\n"
        f"tm = torchmagic.resume({str(saved['resnet18'])!r}, model, optimizer, [scheduler])\n"
        "assert [e.action for e in tm.history()] == ['freeze', 'replace_head', 'unfreeze']\n"
        "train(model, optimizer, images, scheduler.step)\n"
        f"torch.save(everything(model, optimizer, scheduler), {str(after['resnet18'])!r})\n"
        "cnx, cnx_opt, cnx_sched = build_convnext(seed=11)\n"
        f"torchmagic.resume({str(saved['convnext'])!r}, cnx, cnx_opt, [cnx_sched])\n"
        "assert cnx.num_classes == 5\n"
        "assert {g['weight_decay'] for g in cnx_opt.param_groups} == {0.0, 0.05}\n"
        "train(cnx, cnx_opt, images); cnx_sched.step(3)\n"
        f"torch.save(everything(cnx, cnx_opt, cnx_sched), {str(after['convnext'])!r})\n"
        "clf, clf_opt, clf_sched = build_bert(seed=11)\n"
        f"torchmagic.resume({str(saved['bert'])!r}, clf, clf_opt, [clf_sched])\n"
        "assert clf.num_labels == 4 and clf.config.id2label == dict(enumerate('wxyz'))\n"
        "assert len(clf_sched.lr_lambdas) == 2\n"
        "train(clf, clf_opt, tokens, clf_sched.step, logits)\n"
        f"torch.save(everything(clf, clf_opt, clf_sched), {str(after['bert'])!r})\n"
        "net, net_opt, net_sched = build_net(seed=11)\n"
        f"tm = torchmagic.resume({str(saved['lr_find'])!r}, net, net_opt, [net_sched])\n"
        "assert tm.history()[-1].action == 'set_lr'\n"
        "train(net, net_opt, loader(), net_sched.step)\n"
        f"torch.save(everything(net, net_opt, net_sched), {str(after['lr_find'])!r})\n"
        "small, small_opt, small_sched = build_net(seed=11)\n"
        f"tm = torchmagic.resume({str(saved['bf16'])!r}, small, small_opt, [small_sched])\n"
        "assert tm.amp_status().enabled and tm.amp_status().dtype == 'bf16'\n"
        "amp_train(tm, small, small_opt, loader(), small_sched)\n"
        f"torch.save(everything(small, small_opt, small_sched), {str(after['bf16'])!r})\n"
    )


def test_saved_in_a_real_kernel_resumed_in_a_fresh_process(tmp_path):
    """Weights, optimizer state by name, flags, every group's hyper-parameters and the
    scheduler's state agree exactly after both went on training."""
    src = str(Path(torchmagic.__file__).resolve().parents[1])
    saved = {case: tmp_path / f"{case}.pt" for case in CASES}
    in_kernel = {case: tmp_path / f"{case}-kernel.pt" for case in CASES}
    in_script = {case: tmp_path / f"{case}-script.pt" for case in CASES}
    common = (
        f"import sys, torch\nsys.path[:0] = {[str(HERE), str(TESTS)]!r}\n"
        "torch.set_num_threads(1)  # the same arithmetic in both processes\n"
        "import torchmagic\n"
        "from checkpoint_helpers import (amp_train, batches, build_bert, build_convnext,\n"
        "    build_resnet18, everything, logits, token_batches, train)\n"
        "from test_checkpoint import build_net, loader\n"
        "images, tokens = batches(2, (2, 3, 32, 32), 5), token_batches(2)\n"
    )
    cells = _kernel_cells(saved, in_kernel)
    cells.insert(1, common)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbformat.write(nb, tmp_path / "save.ipynb")
    executed = execute_notebook(tmp_path / "save.ipynb")
    shown = executed.cells[cells.index(f"%tm save {saved['resnet18']}")].outputs[0]["data"]
    assert "text/html" in shown and "%unfreeze layer3 lr=1e-4" in shown["text/plain"]
    script = tmp_path / "resume.py"
    script.write_text(common + _resume_script(saved, in_script))
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for case in CASES:
        kernel = torch.load(in_kernel[case], weights_only=True)
        assert_same(kernel, torch.load(in_script[case], weights_only=True), f"{case}: ")
