"""``%tm help`` is one screen (a line per magic: what it is for; in HTML its name links
into the reference); ``%tm help MAGIC`` and ``%magic?`` show the same full usage from the
manifest, arguments first, defaults shown, one example; in a terminal no line is wider
than the terminal; errors are one line."""

from __future__ import annotations

import re

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from torchmagic.manifest import help_text, load_manifest, magic_entry


def _shown(ip, line: str) -> dict[str, str]:
    with capture_output() as cap:
        ip.run_line_magic("tm", line)
    (output,) = cap.outputs
    return output.data


def test_help_is_a_line_per_magic(ip) -> None:
    ip.run_line_magic("config", "TorchMagics.width = 100")
    shown = _shown(ip, "help")
    magics = load_manifest()["magics"]
    lines = shown["text/plain"].splitlines()
    assert len(lines) == len(magics) + 2  # the title, a line each, the reference
    for magic, line in zip(magics, lines[1:], strict=False):
        escape = "%%" if magic["kind"] == "cell" else "%"
        assert line.startswith(f"{escape}{magic['name']} ") and line.endswith(magic["purpose"])
    assert "`" not in shown["text/plain"] and "#" not in shown["text/plain"]  # no anchors
    assert lines[-1] == f"reference: {load_manifest()['documentation']}"
    for magic in magics:  # each name links into the reference
        assert f'<a href="{magic["docs"]}">' in shown["text/html"]


def test_help_fits_sixty_columns(ip) -> None:
    ip.run_line_magic("config", "TorchMagics.width = 60")
    lines = _shown(ip, "help")["text/plain"].splitlines()
    assert len(lines) == len(load_manifest()["magics"]) + 2  # no line wrapped
    assert all(len(line) <= 60 for line in lines) and "#freeze" not in lines[1]
    # the address would be cut: the repository and the file instead
    assert lines[-1] == "reference: github.com/torchmagic/torchmagic, docs/magics.md"


def test_help_of_one_magic_is_its_usage(ip) -> None:
    ip.run_line_magic("config", "TorchMagics.width = 90")
    for typed, kind in (("fit", "line"), ("%fit", "line"), ("%%amp", "cell")):
        entry = magic_entry(typed.lstrip("%"), kind)
        assert _shown(ip, f"help {typed}")["text/plain"] == help_text(entry, 90)
    load = _shown(ip, "help load_model")["text/plain"]
    assert "`" not in load and "preprocess = weights.transforms()" in " ".join(load.split())
    with pytest.raises(UsageError, match="no magic named 'fitt'; did you mean fit"):
        ip.run_line_magic("tm", "help fitt")


def _ragged(lines: list[str], width: int) -> list[str]:
    """Lines of one word that would have fitted at the end of the line before, inside a
    paragraph (the next line goes on at the same indent): a text wrapped twice."""
    found = []
    for before, line, after in zip(lines, lines[1:], lines[2:], strict=False):
        indent = len(line) - len(line.lstrip())
        same = after.strip() and len(after) - len(after.lstrip()) == indent
        if len(line.split()) == 1 and before.strip() and same:
            if len(before) + 1 + len(line.strip()) <= width:
                found.append(line)
    return found


@pytest.mark.parametrize("width", [60, 80, 100])
def test_help_of_a_magic_wraps_once_at_the_width(ip, width) -> None:
    ip.run_line_magic("config", f"TorchMagics.width = {width}")
    for magic in load_manifest()["magics"]:
        typed = f"{'%%' if magic['kind'] == 'cell' else ''}{magic['name']}"
        lines = _shown(ip, f"help {typed}")["text/plain"].splitlines()
        laid_out = help_text(magic, width).replace("`", "")  # the text form drops backticks
        assert lines == laid_out.splitlines()  # drawn as laid out: never wrapped again
        assert max(len(line) for line in lines) <= width, typed  # the address too
        assert not _ragged(lines, width), (typed, _ragged(lines, width))

        def words(text: str) -> str:  # the same words at every width, but the address
            return " ".join(text.partition("\n\nreference:")[0].split())

        assert words(help_text(magic, width)) == words(help_text(magic))


def test_the_reference_is_a_whole_address_where_it_fits() -> None:
    fit = magic_entry("fit")
    assert help_text(fit, 100).endswith(f"\n\nreference: {fit['docs']}")
    assert help_text(fit, 70).endswith(f"\n\nreference:\n{fit['docs']}")  # alone on its line
    short = "reference: github.com/torchmagic/torchmagic, docs/magics.md"
    assert help_text(fit, 60).endswith(f"\n\n{short}")
    assert help_text(fit, 50).endswith(
        "\n\nreference: github.com/torchmagic/torchmagic,\ndocs/magics.md"
    )


def test_question_mark_shows_the_manifest_usage(ip) -> None:
    for name in ("freeze", "fit"):
        doc = ip.find_line_magic(name).__doc__
        assert doc == help_text(magic_entry(name))
        assert "::" not in doc
        usage = doc.split("\n\n")[0]
        first_option = usage.index("[--")
        assert usage.startswith(f"%{name} ") and not usage[:first_option].count("--")
        assert magic_entry(name)["example"] in doc
    fit = ip.find_line_magic("fit").__doc__
    assert re.search(r"--epochs N +epochs to train \(default: 1\)", fit)
    assert "(default: cross_entropy)" in fit
    amp = ip.find_line_magic("amp").__doc__
    assert help_text(magic_entry("amp", "cell")) in amp  # the cell magic's usage too


def test_an_error_is_one_short_line(ip) -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ip.user_ns.update(model=model, opt=opt, train_loader=[(torch.zeros(1, 2), torch.zeros(1))])
    for line, fragment in (
        ("trian_loader", "no variable named 'trian_loader' for train; did you mean train_loader?"),
        ("train_loader --epochs x", "--epochs takes a whole number, got 'x'"),
        ("train_loader --patince 2", "unknown option --patince; did you mean --patience?"),
        (
            "train_loader --monitor los",
            "--monitor must be one of loss, acc, accuracy, f1, precision, recall, top5, auroc, "
            "got 'los'; did you mean loss?",
        ),
        ("train_loader --val", "--val needs VAL_LOADER after it"),
    ):
        with pytest.raises(UsageError) as info:
            ip.run_line_magic("fit", line)
        text = str(info.value)
        assert text.startswith(fragment) and "\n" not in text
        assert len(text) < 160 and "usage" not in text
