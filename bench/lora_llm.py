"""LoRA on language models: a Llama-3-70B-shaped model on the meta device (what each
command costs in time and memory) and a GPT-2-small-shaped model on the CPU (step time
and optimizer state of ``%lora c_attn r=8`` against peft's ``get_peft_model``).

Not a test. Run from the repository root::

    .venv/bin/python bench/lora_llm.py [--section meta|gpt2|all] [--repeat 7] [--tokens 128]

- **meta**: ``LlamaForCausalLM`` with hidden 8192, 80 layers, 64 heads (8 key/value
  heads), intermediate 28672, vocabulary 128256 (70.6B parameters), built under
  ``with torch.device("meta")``. The magics ``%freeze model``, ``%lora q_proj,v_proj
  r=16``, ``%summary``, ``%tm undo`` (twice) in an IPython shell, rendered, each timed
  (median of ``--repeat`` rounds on one model: freeze, lora, summary, undo, undo) with the
  growth of the resident set (now and its peak); peft's ``get_peft_model`` with the same config on
  a fresh meta model beside it. Targets: each under 3 s and under 300 MiB.
- **gpt2**: ``GPT2LMHeadModel(GPT2Config())`` (124M, random weights), batch 2 x 128
  tokens, AdamW(lr=1e-4). ``%lora``: an AdamW over every parameter, then
  ``Session.freeze()`` and ``Session.lora("c_attn", r=8)``; peft: ``get_peft_model`` with
  ``target_modules=["c_attn"]``, r=8, and an AdamW over what trains. The optimizer-state
  bytes after the first step and the median of ``--repeat`` training steps (forward with
  labels, backward, step), wall and CPU time, the two setups' steps interleaved (ABBA) so
  that the load of a shared machine falls on both alike. Target: %lora / peft <= 1.0x (CPU
  time: the same work on one thread, whatever else the machine runs).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import resource
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import torch
import transformers
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from machine import describe  # noqa: E402

from torchmagic import Session  # noqa: E402
from torchmagic.core.tensors import state_bytes  # noqa: E402

MiB = 2**20


def _rss() -> float:
    """The resident set now, MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MiB


def _peak() -> float:
    """The resident set's peak so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def llama_70b_on_meta() -> nn.Module:
    config = transformers.LlamaConfig(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
    )
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config)


def meta(repeat: int) -> None:
    import peft

    start = time.perf_counter()
    model = llama_70b_on_meta()
    built = time.perf_counter() - start
    total = sum(p.numel() for p in model.parameters())
    print(
        f"\n## Llama-3-70B-shaped, meta device: {total / 1e9:.1f}B parameters, built in "
        f"{built:.2f} s, resident {_rss():.0f} MiB\n"
    )
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "torchmagic")
    ip.user_ns["model"] = model

    def magic(line: str) -> Callable[[], object]:
        name, _, rest = line.partition(" ")

        def run() -> None:
            with contextlib.redirect_stdout(io.StringIO()):  # the rendered output, unread
                ip.run_line_magic(name, rest)

        return run

    steps = {
        "%freeze model": magic("freeze model"),
        "%lora q_proj,v_proj r=16": magic("lora q_proj,v_proj r=16"),
        "%summary": magic("summary"),
        "%tm undo (the lora)": magic("tm undo"),
        "%tm undo (the freeze)": magic("tm undo"),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    grown: dict[str, float] = dict.fromkeys(steps, 0.0)
    peaks: dict[str, float] = dict.fromkeys(steps, 0.0)
    for _ in range(repeat):
        for name, step in steps.items():
            rss, peak = _rss(), _peak()
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
            grown[name] = max(grown[name], _rss() - rss)
            peaks[name] = max(peaks[name], _peak() - peak)
    fresh = llama_70b_on_meta()
    rss, peak = _rss(), _peak()
    start = time.perf_counter()
    wrapped = peft.get_peft_model(fresh, peft.LoraConfig(r=16, target_modules=["q_proj", "v_proj"]))
    theirs = time.perf_counter() - start
    theirs_grown, theirs_peak = _rss() - rss, _peak() - peak
    print("| command | median | max | resident growth | peak growth | target |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for name in steps:
        ok = max(times[name]) < 3 and max(grown[name], peaks[name]) < 300
        print(
            f"| {name} | {statistics.median(times[name]):.3f} s | {max(times[name]):.3f} s | "
            f"{grown[name]:+.0f} MiB | {peaks[name]:+.0f} MiB | {'PASS' if ok else 'FAIL'} |"
        )
    print(
        f"| peft get_peft_model (same targets) | {theirs:.3f} s | — | {theirs_grown:+.0f} MiB | "
        f"{theirs_peak:+.0f} MiB | — |"
    )
    trainable, _ = wrapped.get_nb_trainable_parameters()
    print(f"\nadapters: {trainable / 1e6:.2f}M parameters (peft's count)")


def _gpt2() -> nn.Module:
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config())


def gpt2_ours() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = _gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tm = Session(model, opt)
    tm.freeze()
    tm.lora("c_attn", r=8)
    return model, opt


def gpt2_peft() -> tuple[nn.Module, torch.optim.Optimizer]:
    import peft

    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"], fan_in_fan_out=True)
    model = peft.get_peft_model(_gpt2(), config)
    return model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)


def gpt2(repeat: int, tokens: int) -> None:
    ids = torch.randint(0, 50257, (2, tokens), generator=torch.Generator().manual_seed(0))
    setups = {"%lora c_attn r=8": gpt2_ours(), "peft get_peft_model": gpt2_peft()}

    def step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    states: dict[str, int] = {}
    times: dict[str, list[float]] = {name: [] for name in setups}
    cpu: dict[str, list[float]] = {name: [] for name in setups}
    for name, (model, opt) in setups.items():
        model.train()
        step(model, opt)
        states[name] = state_bytes(opt, list(opt.state))
        step(model, opt)
    for i in range(repeat):
        order = list(setups.items())
        for name, (model, opt) in order if i % 2 else order[::-1]:  # ABBA: no side goes first
            start, start_cpu = time.perf_counter(), time.process_time()
            step(model, opt)
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    print(
        f"\n## GPT-2-small-shaped (124M, random weights), CPU, batch 2 x {tokens} tokens, AdamW\n"
    )
    print("| setup | trainable | optimizer state | step, wall (median) | step, CPU (median) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, (model, _) in setups.items():
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        print(
            f"| {name} | {trainable / 1e6:.3f}M | {states[name] / MiB:.2f} MiB | "
            f"{statistics.median(times[name]) * 1e3:.0f} ms | "
            f"{statistics.median(cpu[name]) * 1e3:.0f} ms |"
        )
    wall, theirs_wall = (statistics.median(t) for t in times.values())
    ours, theirs = (statistics.median(t) for t in cpu.values())
    state_ratio = states["%lora c_attn r=8"] / states["peft get_peft_model"]
    # the verdict reads CPU time: one thread, so another process's load does not count
    verdict = "PASS" if ours / theirs <= 1.0 and state_ratio <= 1.0 else "FAIL"
    print(
        f"\n%lora vs get_peft_model: state {state_ratio:.3f}x, step {ours / theirs:.3f}x CPU "
        f"({wall / theirs_wall:.3f}x wall) (target <= 1.0x): {verdict}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=("meta", "gpt2", "all"), default="all")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=128, help="GPT-2's sequence length")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    print(describe())
    print(f"load average {os.getloadavg()[0]:.1f}, transformers {transformers.__version__}")
    if args.section in ("meta", "all"):
        meta(args.repeat)
    if args.section in ("gpt2", "all"):
        gpt2(args.repeat, args.tokens)


if __name__ == "__main__":
    main()
