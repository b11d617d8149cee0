"""Session's surgery methods: the commands that edit a model in place (freeze, unfreeze,
replace_head, LoRA) and the summary of what they did; each delegates to ``surgery``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..advice import Command
from ..surgery.grammar import LrSpec
from ..surgery.results import Change, SummaryReport
from . import shared, surgery
from .part import SessionPart

if TYPE_CHECKING:
    pass


class SurgeryFacade(SessionPart):
    """The surgery part of :class:`Session`'s front door."""

    # -- surgery ---------------------------------------------------------------------

    @shared.serialised()
    def freeze(
        self,
        *targets: str,
        exclude: Sequence[str] = (),
        bn: str | None = None,
        optimizer: str | None = None,
        dry_run: bool = False,
        command: Command | None = None,
    ) -> Change:
        """Stop training ``targets``: requires_grad off, out of the optimizer (state set
        aside for undo), BatchNorm per policy. No targets means the whole model."""
        return surgery.freeze(self._session, targets, exclude, bn, optimizer, dry_run, command)

    @shared.serialised()
    def unfreeze(
        self,
        *targets: str,
        lr: LrSpec = None,
        wd: float | None = None,
        exclude: Sequence[str] = (),
        optimizer: str | None = None,
        dry_run: bool = False,
        command: Command | None = None,
    ) -> Change:
        """Train ``targets`` again, each block in its own named param group.

        ``lr`` is a float, or ``(first, last)`` for a geometric spread over the blocks in
        module order; without it, ``unfreeze_lr_ratio`` × the head group's lr. ``wd``
        overrides weight decay for the new groups.
        """
        return surgery.unfreeze(
            self._session, targets, lr, wd, exclude, optimizer, dry_run, command
        )

    @shared.serialised()
    def replace_head(
        self,
        where: str | None,
        num_classes: int | None = None,
        *,
        dropout: float | None = None,
        labels: Sequence[str] | None = None,
        optimizer: str | None = None,
        dry_run: bool = False,
        command: Command | None = None,
    ) -> Change:
        """Swap the head for a fresh layer with ``num_classes`` outputs.

        ``where`` is ``"auto"``/None (search the current model), a path to the head
        (``"fc"``, ``"model.classifier.6"``), or a model/sub-tree to search. ``labels``
        names the classes in a Hugging Face config; the class count is required unless
        ``labels`` gives it.
        """
        return surgery.replace_head(
            self._session, where, num_classes, dropout, labels, optimizer, dry_run, command
        )

    @shared.serialised()
    def lora(
        self,
        *targets: str | Sequence[str],
        r: int = 8,
        alpha: float = 16,
        dropout: float = 0.0,
        use_dora: bool = False,
        use_rslora: bool = False,
        lr: float | None = None,
        optimizer: str | None = None,
        dry_run: bool = False,
        command: Command | None = None,
    ) -> Change:
        """Low-rank adapters (peft's LoRA layers, rank ``r``, scale ``alpha / r``, or
        ``alpha / sqrt(r)`` with ``use_rslora``; DoRA with ``use_dora``) on the Linear /
        Conv1D / Conv2d / Embedding layers ``targets`` name or contain, in place: their
        base weights stop training and leave the optimizer, the adapters train in a new
        ``lora`` group at base lr ``lr`` (default: the head group's base lr). A target is
        the grammar's, or peft's spelling: ``"q_proj,v_proj"`` or a list
        ``["q_proj", "v_proj"]`` names every module whose path ends so, as does a name
        that is no path from the root (``"c_attn"``). See ``core.surgery.lora``."""
        return surgery.add_lora(
            self._session,
            targets,
            (r, alpha, dropout, use_dora, use_rslora),
            lr,
            optimizer,
            dry_run,
            command,
        )

    @shared.serialised()
    def merge_lora(
        self,
        model: str | None = None,
        *,
        optimizer: str | None = None,
        dry_run: bool = False,
        command: Command | None = None,
    ) -> Change:
        """Fold the (current) model's LoRA adapters into its weights: the layers get their
        old names and types back, trainable as before :meth:`lora`; the adapters leave the
        optimizer (their group stays, emptied)."""
        return surgery.merge_lora(self._session, model, optimizer, dry_run, command)

    @shared.serialised()
    def lora_off(self, model: str | None = None, *, command: Command | None = None) -> Change:
        """The (current) model without its LoRA adapters' contribution (kept, not merged)."""
        return surgery.switch_lora(self._session, model, False, command)

    @shared.serialised()
    def lora_on(self, model: str | None = None, *, command: Command | None = None) -> Change:
        """The LoRA adapters switched off by :meth:`lora_off` contribute again."""
        return surgery.switch_lora(self._session, model, True, command)

    def summary(
        self,
        where: str | None = None,
        depth: int | None = None,
        input_shape: Sequence[int] | None = None,
    ) -> SummaryReport:
        """A bounded table of the model (or a sub-tree) with trainable state and groups;
        with ``input_shape`` (batch first, ``(1, 3, 224, 224)``) each module's output shape
        and bytes too, from one forward on the meta device (no memory, no arithmetic)."""
        return surgery.summary(self._session, where, depth, input_shape)
