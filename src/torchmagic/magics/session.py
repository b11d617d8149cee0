"""``%tm``: the session itself — history, undo, the current model, fits, doctor, save,
load, export, help."""

from __future__ import annotations

import argparse

from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument

from ..core import ExportOptions
from ..core.surgery.grammar import parse_shape
from ..core.surgery.results import CommandHistory
from ..manifest import load_manifest, magic_named
from .base import TopicMagics, parse, render, strip_comment
from .usage import Subcommand, subcommands, usage


@magics_class
class SessionMagics(TopicMagics):
    """Commands about the session rather than one model."""

    # -- subcommands: one Session call each, rendered (the table below lists them) ----

    def _history(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        session = self.session
        return render.render(CommandHistory(session.history(), session.undone()), self.width)

    def _undo(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        return render.render(self.session.undo(), self.width)

    def _clear(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        cleared = self.session.clear_history()
        return render.render(
            f"history cleared: {cleared.commands} command(s) forgotten, "
            f"{render.human_bytes(cleared.nbytes)} released; nothing can be undone now",
            self.width,
        )

    def _use(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        return render.render(f"current model: {self.session.use(words[0])}", self.width)

    def _fits(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        return render.render(render.FitRuns(tuple(self.session.fits)), self.width)

    def _doctor(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        return render.render(self.session.doctor(), self.width)

    def _save(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        return render.render(self.session.save(words[0], sync=args.sync), self.width)

    def _load(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        return render.render(self.session.load(words[0]), self.width)

    def _export(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        shape = parse_shape(args.input_shape) if args.input_shape else None
        report = self.session.export(
            words[0],
            args.model,
            force=args.force,
            input_shape=shape,
            tolerance=args.tolerance,
        )
        return render.render(report, self.width)

    def _help(self, words: list[str], args: argparse.Namespace) -> render.Rendered:
        if not words:
            return render.render(render.ManifestHelp(load_manifest()), self.width)
        entry = magic_named(words[0])
        return render.render(render.MagicHelp(entry), self.width)

    @usage("%tm undo", "the session: history, undo, save, help")
    @argument(
        "words",
        nargs="*",
        metavar="SUBCOMMAND",
        help="a subcommand and its words (listed below)",
    )
    @argument(
        "--sync",
        action="store_true",
        help="with save: fsync the file before returning, so it survives a power loss too",
    )
    @argument(
        "--force",
        action="store_true",
        help="with export: replace the file if it exists",
    )
    @argument(
        "--model",
        default=None,
        metavar="NAME",
        help="with export: the model to export (default: the current one)",
    )
    @argument(
        "--input-shape",
        default=None,
        metavar="SHAPE",
        help="with export for inference: one batch's shape, batch first (1,3,224,224), when "
        "the model's weights or config do not say it",
    )
    @argument(
        "--tolerance",
        type=float,
        default=ExportOptions.tolerance,
        metavar="X",
        help="with export for inference: the largest difference allowed between the file's "
        "outputs and the live model's",
    )
    @subcommands(
        Subcommand("history", _history, "the mutating commands so far"),
        Subcommand("undo", _undo, "revert the last command still applying to a bound model"),
        Subcommand("clear", _clear, "forget the history and release what undo kept alive"),
        Subcommand("use", _use, "make NAME the current model", words="NAME", arity=(1, 1)),
        Subcommand("fits", _fits, "every %fit run side by side"),
        Subcommand("doctor", _doctor, "the classic transfer-learning mistakes, with fixes"),
        Subcommand(
            "save",
            _save,
            "write the training state to one file",
            words="PATH",
            arity=(1, 1),
            options=("--sync",),
        ),
        Subcommand(
            "load",
            _load,
            "continue from a saved file on a freshly built model",
            words="PATH",
            arity=(1, 1),
        ),
        Subcommand(
            "export",
            _export,
            "by suffix: .py the commands as a script; .pt2, .safetensors, .onnx the model "
            "for inference, checked against the live model",
            words="PATH",
            arity=(1, 1),
            options=("--force", "--model", "--input-shape", "--tolerance"),
        ),
        Subcommand(
            "help",
            _help,
            "every magic in a line; with MAGIC, its full usage",
            words="[MAGIC]",
            arity=(0, 1),
        ),
    )
    @line_magic
    def tm(self, line: str) -> None:
        """Session commands: list the mutating commands, undo the last one, clear the
        history, pick the current model, compare every %fit run side by side, diagnose the
        classic transfer-learning mistakes, save / load the training state, export the
        commands as a script or the model for inference, show the help of every magic or of one."""
        args = parse(self.tm, line)
        with self.interrupts(f"%tm {strip_comment(line).strip()}"):
            self.show(self.dispatch(self.tm, args.words, args))
