"""No table cell breaks a word, at any width.

rich narrows a wrapping column below its longest word when a table is wider than the
width, so a cell can break a word mid-way: a module path ``word_embedd|ings``, a type
``BertForSequenceClassif|ication``, an lr ``1e-4…0.00|1``. A name cut in two reads as two
names, so every table is drawn with its names and numbers whole and only its prose
wrapping, at spaces.

How it is checked: ``Rendered.drawn`` gives each part exactly as ``Rendered.lines`` draws
it (a nested Group flattened) with the width it is drawn at. For each rich Table among
them the column widths are the ones rich itself computes for that width
(``Table._calculate_column_widths``, the call ``Table.__rich_console__`` makes; a check
against the drawn table's own width guards against a rich that computes them elsewhere).
Each cell, header included, padded as the table pads it (``Table._get_cells``), is then
drawn alone with the options rich draws it with (the column's width, justify, no_wrap and
overflow). Its words — the text of its lines split at whitespace — must be the words of
the same cell drawn without a width limit: a word folded over two lines, cropped or cut
with an ellipsis shows up as a different list of words, while wrapping at a space leaves
the list as it was. Titles, notes and other lines outside tables may wrap as they like.

The other side of it: a table is drawn wider than the width only where its words need it
(``wider_than_needed``): then every column is exactly as wide as its longest word, or, for
a column that does not wrap, its widest cell, so narrow widths still fit where words allow.

The cases are every result the golden tests build (their builders, reused), drawn at 60,
80, 100 and 140 columns, and stress cases with long names: a Hugging Face BERT with
timm's decay / no-decay groups, long scheduler names, long doctor findings, long tensor
paths and device details.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from rich.console import Console, RenderableType
from rich.table import Table

from test_golden import CASES, PROGRESS, _progress
from torchmagic import Session, render
from torchmagic.core.devices.device import DeviceInfo, DeviceReport
from torchmagic.core.devices.placement import CheckReport, Misplaced
from torchmagic.core.diagnostics.doctor import DoctorReport
from torchmagic.core.diagnostics.findings import Finding
from torchmagic.core.surgery.results import (
    Change,
    CommandHistory,
    Counts,
    Effect,
    GroupInfo,
    HistoryEntry,
)
from torchmagic.core.training.fit_events import EpochMetrics, FitHistory, StepInfo
from torchmagic.manifest import load_manifest
from torchmagic.render import FitRuns, ManifestHelp, NotebookProgress

WIDTHS = (60, 80, 100, 140)
UNLIMITED = 10_000


# -- the check ----------------------------------------------------------------------------


def _words(console: Console, renderable: RenderableType, options) -> list[str]:
    lines = console.render_lines(renderable, options, pad=False)
    return "\n".join("".join(s.text for s in line) for line in lines).split()


def _column_widths(console: Console, drawn: Table, width: int) -> list[int]:
    """The widths rich draws ``drawn``'s columns at (padding included), as
    ``Table.__rich_console__`` computes them, checked against the drawn table."""
    options = console.options.update_width(width)
    max_width = drawn.width if drawn.width is not None else options.max_width
    extra = drawn._extra_width
    widths = drawn._calculate_column_widths(console, options.update_width(max_width - extra))
    rows = console.render_lines(drawn, options, pad=False)
    if drawn.show_header or drawn.rows:  # the widest line is a rule, or a padded row
        widest = max(len("".join(s.text for s in line)) for line in rows)
        assert sum(widths) + extra <= widest, "rich computes its column widths elsewhere"
    return widths


def broken_cells(rendered: render.Rendered) -> list[str]:
    """Each table cell of ``rendered`` whose words its drawing breaks, described."""
    console = rendered.console()
    broken = []
    for part, width in rendered.drawn(console):
        if not isinstance(part, Table):
            continue
        widths = _column_widths(console, part, width)
        for index, (column, column_width) in enumerate(zip(part.columns, widths, strict=True)):
            for cell in part._get_cells(console, index, column):
                options = console.options.update(
                    width=column_width,
                    justify=column.justify,
                    no_wrap=column.no_wrap,
                    overflow=column.overflow,
                    height=None,
                )
                words = _words(console, cell.renderable, options)
                whole = _words(
                    console,
                    cell.renderable,
                    console.options.update(width=UNLIMITED, no_wrap=False, height=None),
                )
                if words != whole:
                    title = part.title or "(untitled)"
                    broken.append(
                        f"{title!s:.40} · column {column.header or index!s} "
                        f"({column_width} wide): {' '.join(whole)!r} drawn as {words}"
                    )
    return broken


def wider_than_needed(rendered: render.Rendered) -> list[str]:
    """Each table of ``rendered`` drawn wider than the width although a column of it
    could be narrower: one that wraps narrower than its longest word is a broken word,
    one that does not wrap narrower than its widest cell a cropped one, so a table is
    only ever wider than the width with every column at that minimum."""
    console = rendered.console()
    wide = []
    for part, width in rendered.drawn(console):
        if not isinstance(part, Table):
            continue
        widths = _column_widths(console, part, width)
        if sum(widths) + part._extra_width <= rendered.width:
            continue
        for index, (column, column_width) in enumerate(zip(part.columns, widths, strict=True)):
            sizes = [
                console.measure(cell.renderable, options=console.options.update_width(UNLIMITED))
                for cell in part._get_cells(console, index, column)
            ]
            need = max(s.maximum if column.no_wrap else s.minimum for s in sizes)
            if column_width > need:
                wide.append(
                    f"{part.title!s:.40} · column {column.header or index}: {column_width} > {need}"
                )
    return wide


# -- stress cases: long names ---------------------------------------------------------------


def _bert_session() -> Session:
    """A Hugging Face BERT with timm's decay / no-decay groups, one block unfrozen at its
    own lr: group names like ``bert.embeddings · no_decay``, long type names."""
    transformers = pytest.importorskip("transformers")
    timm_optim = pytest.importorskip("timm.optim")
    config = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64
    )
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    opt = timm_optim.create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    return Session(model, opt)


def _bert_results() -> list[object]:
    tm = _bert_session()
    froze = tm.freeze("bert.embeddings", command="%freeze bert.embeddings")
    unfroze = tm.unfreeze("bert.embeddings", lr=1e-4, command="%unfreeze bert.embeddings lr=1e-4")
    froze_encoder = tm.freeze(
        "bert.encoder.layer.0", command="%freeze bert.encoder.layer.0 --dry-run", dry_run=True
    )
    return [
        froze,
        unfroze,
        froze_encoder,
        tm.summary(depth=3),
        tm.summary(depth=5),
        CommandHistory(tm.history()),
    ]


_COUNTS = Counts(total=4_400_000, trainable=1_200_000, tensors=201, param_bytes=0, buffer_bytes=0)
_SCHEDULERS = ("CosineAnnealingWarmRestarts", "SequentialLR", "ReduceLROnPlateau")


def _long_schedules() -> Change:
    """Groups with long names, each stepped by its own long-named schedulers."""
    groups = (
        GroupInfo(0, "classifier", 2.45e-5, 0.0, 2, 1_538, "", 1e-3, _SCHEDULERS[:2]),
        GroupInfo(
            1,
            "bert.encoder.layer.1.attention.output · no_decay",
            2.45e-6,
            0.0,
            6,
            5_120,
            "new",
            1e-4,
            _SCHEDULERS,
        ),
        GroupInfo(
            2, "bert.embeddings.word_embeddings", 1e-4, 0.05, 1, 976_896, "changed", None, ()
        ),
        GroupInfo(3, "3", 0.001, None, 0, 0, "", None, ("OneCycleLR",)),
    )
    return Change(
        action="unfreeze",
        command="%unfreeze bert.encoder.layer.1.attention.output lr=1e-4",
        model_name="bert_for_sequence_classification",
        effect=Effect(
            ("bert.encoder.layer.1.attention.output",),
            2_176,
            0,
            {},
            ("new head: Linear(in_features=32, out_features=2, bias=True) on cpu float32",),
        ),
        before=_COUNTS,
        after=_COUNTS,
        optimizer_name="optimizer_with_decay_and_no_decay_groups",
        groups=groups,
    )


def _long_doctor() -> DoctorReport:
    return DoctorReport(
        findings=(
            Finding(
                "stale-optimizer-after-replace-head",
                "error",
                "optimizer_with_decay_and_no_decay_groups",
                "holds none of bert_for_sequence_classification's parameters since "
                "%replace_head bert_for_sequence_classification.classifier 10",
                "re-create the optimizer: opt = torch.optim.AdamW(model.parameters(), "
                "lr=1e-4) and bind it with %tm optimizer opt",
            ),
            Finding(
                "idle-optimizer-state",
                "warning",
                "optimizer.state[bert.encoder.layer.0.attention.self.query.weight]",
                "frozen parameters keep exp_avg and exp_avg_sq state on cuda:0",
                "free it with %tm free-state",
                41_943_040,
            ),
            Finding(
                "amp",
                "info",
                "session",
                "bf16 autocast is available on NVIDIA H200 (compute capability 9.0)",
                "turn AMP on with %amp bf16",
            ),
        ),
        scanned=("bert_for_sequence_classification", "optimizer_with_decay_and_no_decay_groups"),
    )


def _long_misplaced() -> CheckReport:
    stray = (
        Misplaced(
            "optimizer.state[bert.encoder.layer.1.attention.self.query.weight].exp_avg_sq",
            "optimizer state",
            "cuda:0",
            (32, 32),
            4_096,
            "move the optimizer state with %device cuda:1 --optimizer",
        ),
        Misplaced(
            "bert.embeddings.position_ids_cache_for_rotary_positions",
            "attribute",
            "cpu",
            (1, 512),
            4_096,
            "register it as a buffer",
        ),
    )
    return CheckReport("bert_for_sequence_classification", "cuda:1", 201, stray)


def _long_devices() -> DeviceReport:
    return DeviceReport(
        devices=(
            DeviceInfo(
                "cpu",
                "AMD EPYC 9654 96-Core Processor",
                "",
                None,
                68_719_476_736,
                False,
                "192 threads",
                False,
            ),
            DeviceInfo(
                "cuda:0",
                "NVIDIA H200 NVL (MIG 3g.71gb, UUID MIG-5d2c1f0e-8a7b)",
                "9.0",
                70 * 2**30,
                71 * 2**30,
                True,
                "60 multiprocessors, driver 560.35.03, CUDA 12.6, PCI 0000:9a:00.0",
                True,
            ),
        ),
        current="cuda:0",
        notes=("CUDA initialised by this command",),
    )


_GROUPS = ("bert.embeddings · no_decay", "bert.encoder.layer.1.attention · decay", "classifier")


def _long_fit() -> FitHistory:
    epochs = tuple(
        EpochMetrics(i, 0.6931 / i, 0.7 / i, 0.5 + i / 10, 4096, 12.5, lrs, _GROUPS)
        for i, lrs in ((1, (1e-4, 1e-3, 2.45e-6)), (2, (5e-5, 5e-4, 1.2e-6)))
    )
    return FitHistory(
        "fine-tune bert with decay groups",
        "bert_for_sequence_classification",
        epochs,
        steps=64,
        samples=8192,
        seconds=25.0,
        stopped="early stopping: val_loss did not improve for 3 epochs (patience 3)",
        precision="bf16",
    )


def _long_progress(width: int) -> render.Rendered:
    shown: list[render.Rendered] = []
    clock = iter(range(100, 10_000, 7)).__next__
    progress = NotebookProgress(shown.append, width, clock=lambda: float(clock()))
    progress.on_step(StepInfo(1, 2, 5, 5, 8, 0.42, 0.98765, (1e-4, 1e-3, 2.45e-6), 0.1, _GROUPS))
    progress.on_epoch(_long_fit().epochs[0])
    return shown[-1]


def _long_history() -> CommandHistory:
    modules = tuple(f"bert.encoder.layer.{i}.attention.self" for i in range(8))
    return CommandHistory(
        (
            HistoryEntry(
                1,
                "%freeze bert.encoder.layer.*.attention.self --except bert.encoder.layer.11",
                "freeze",
                "bert_for_sequence_classification",
                modules,
                True,
            ),
            HistoryEntry(
                2,
                "%replace_head bert_for_sequence_classification.classifier 10",
                "replace_head",
                "old",
                ("classifier",),
                False,
            ),
        )
    )


STRESS: dict[str, Callable[[], object]] = {
    "long_schedules": _long_schedules,
    "long_doctor": _long_doctor,
    "long_misplaced": _long_misplaced,
    "long_devices": _long_devices,
    "long_fit": _long_fit,
    "long_fits": lambda: FitRuns((_long_fit(), _long_fit())),
    "long_history": _long_history,
    "manifest_help_real": lambda: ManifestHelp(load_manifest()),
}


# -- the tests ------------------------------------------------------------------------------


def _at(width: int) -> list[tuple[str, render.Rendered]]:
    drawn = [(case, render.render(make(), width=width)) for case, make in CASES.items()]
    drawn += [(case, render.render(make(), width=width)) for case, make in STRESS.items()]
    drawn += [
        (case, render.Rendered(_progress(stage).renderable, width))
        for case, stage in PROGRESS.items()
    ]
    drawn.append(("long_progress", _long_progress(width)))
    return drawn


@pytest.mark.parametrize("width", WIDTHS)
def test_no_table_cell_breaks_a_word(width: int) -> None:
    broken = [f"{case}: {cell}" for case, drawn in _at(width) for cell in broken_cells(drawn)]
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_table_is_wider_than_the_width_only_where_its_words_need(width: int) -> None:
    wide = [
        f"{case}: {column}" for case, drawn in _at(width) for column in wider_than_needed(drawn)
    ]
    assert not wide, "\n".join(wide)


@pytest.fixture(scope="module")
def bert_results() -> list[object]:
    return _bert_results()


@pytest.mark.parametrize("width", WIDTHS)
def test_bert_with_timm_groups_breaks_no_word(bert_results, width: int) -> None:
    drawn = [render.render(result, width=width) for result in bert_results]
    broken = [f"{type(d).__name__}: {cell}" for d in drawn for cell in broken_cells(d)]
    assert not broken, "\n".join(broken)
    wide = [f"{type(d).__name__}: {column}" for d in drawn for column in wider_than_needed(d)]
    assert not wide, "\n".join(wide)


def test_the_check_sees_a_broken_word() -> None:
    """A table rich draws with a word cut (two wrapping columns, one long word) fails."""
    drawn = Table(title="t")
    drawn.add_column("name")
    drawn.add_column("prose")
    drawn.add_row("bert.embeddings.word_embeddings", "a long sentence " * 4)
    assert broken_cells(_AsRichDraws(drawn, 40))
    assert not broken_cells(_AsRichDraws(drawn, 140))


class _AsRichDraws(render.Rendered):
    """The table drawn by rich alone, at the width given."""

    def drawn(self, console: Console) -> list[tuple[RenderableType, int]]:
        return [(self.renderable, self.width)]


def test_the_terminal_live_view_keeps_words_where_it_fits() -> None:
    """The terminal's live %fit view draws its epoch table through ``Fitted``: words and
    numbers whole, the least important columns hidden (and named) where the table does
    not fit the terminal; where even its key columns cannot fit, rich's own layout (a
    live view crops what is wider than the terminal, which would lose columns)."""
    import io

    from torchmagic.render.base import Fitted
    from torchmagic.render.training import epoch_table

    drawn = epoch_table([EpochMetrics(1, 1.2345678, 1.1, 0.5, 512, 2.0, (1e-3, 2.45e-6))])

    def printed(renderable: RenderableType, width: int) -> str:
        console = Console(file=io.StringIO(), width=width, markup=False)
        console.print(renderable)
        return console.file.getvalue()

    wide = printed(Fitted(drawn), 100)
    assert "samples/s" in wide and "2.45e-6" in wide and "hidden" not in wide
    narrow = printed(Fitted(drawn), 50)
    assert max(map(len, narrow.splitlines())) <= 50
    assert "1.2346" in narrow and "1.00e-3" in narrow and "sampl" not in narrow.split("…")[0]
    assert "hidden at 50 columns: time (s), samples/s, lr group 1" in " ".join(narrow.split())
    assert "samples/s" not in printed(drawn, 50)  # rich alone: "sampl" / "es/s"
    assert printed(Fitted(drawn), 20) == printed(drawn, 20)
