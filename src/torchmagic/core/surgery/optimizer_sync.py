"""In-place edits of a live optimizer's param groups and state, each with its inverse.

Parameters are matched by identity. Groups are never deleted (a group emptied by a freeze
stays, so every scheduler's per-group lists keep their length); new groups are appended
with ``add_param_group`` so the optimizer fills in its own defaults.

Every parameter has a *home group*: the group it was in when a command first saw the
optimizer, or when it was last frozen. Unfreezing without an lr sends it back there; a new
group made for it takes its home group's hyper-parameters (weight decay, betas, …), so
the user's own groups (decay / no-decay, backbone / head) survive surgery.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from ..dtensors import HostShard, from_host, held, local_nbytes, to_host
from ..integrations.lookup import state_of
from ..modules import parameter_names
from ..registry import REGISTRY
from ..tensors import step_stays_on_host
from .model_checks import check_optimizer, check_takes
from .transaction import Transaction

# Group keys owned by LR schedulers: set by scheduler_sync for new groups, never copied.
SCHEDULE_KEYS = frozenset(
    {"initial_lr", "max_lr", "min_lr", "swa_lr", "max_momentum", "base_momentum"}
)
# Keys that decide a group's lr (timm's layer-wise ``lr_scale``): a new group at a given
# base lr does not inherit them.
_LR_KEYS = frozenset({"lr", "lr_scale"})
_IDENTITY_KEYS = frozenset({"params", "param_names", "name"})


def hyperparameters(template: dict) -> dict:
    """What a new group copies from ``template`` (a group, or ``optimizer.defaults``):
    everything but its members, name, lr and schedule keys (``initial_*`` included)."""
    return {
        k: v
        for k, v in template.items()
        if k not in SCHEDULE_KEYS
        and k not in _IDENTITY_KEYS
        and k not in _LR_KEYS
        and not k.startswith("initial_")
    }


def successors(optimizer: torch.optim.Optimizer, groups: Sequence[dict]) -> list[dict | None]:
    """The live group standing for each of ``groups``: itself while it is in the optimizer,
    else the group that replaced it (``load_state_dict``, as ``accelerator.prepare`` calls,
    makes new group dicts around the same ``params`` lists): the live group holding the
    same list object, or else the same parameters in the same order. None: gone."""
    live = optimizer.param_groups
    live_ids = {id(g) for g in live}
    by_list = {id(g["params"]): g for g in live}
    taken = {id(g) for g in groups if id(g) in live_ids}
    found: list[dict | None] = []
    for group in groups:
        if id(group) in live_ids:
            found.append(group)
            continue
        twin = by_list.get(id(group["params"]))
        if twin is None or id(twin) in taken:
            members = [id(p) for p in group["params"]]
            twin = next(
                (
                    g
                    for g in live
                    if members and id(g) not in taken and [id(p) for p in g["params"]] == members
                ),
                None,
            )
        if twin is not None:
            taken.add(id(twin))
        found.append(twin)
    return found


class Homes:
    """The home group of each parameter of one optimizer, by identity.

    Parameters are held strongly: a weak reference would stop ``module.to()`` from
    swapping their tensors (as the undo history does, this keeps a replaced head alive).
    A home group that is no longer in the optimizer counts as no home.
    """

    def __init__(self) -> None:
        self._groups: dict[int, tuple[nn.Parameter, dict]] = {}

    def _home(self, p: nn.Parameter) -> dict | None:
        entry = self._groups.get(id(p))
        return entry[1] if entry is not None else None

    def observe(self, optimizer: torch.optim.Optimizer) -> None:
        """Parameters seen for the first time (or whose home left the optimizer) get the
        group they are in as their home. Not undone (it records what already is), but
        all at once."""
        self._follow(optimizer)
        live = {id(g) for g in optimizer.param_groups}
        seen = {
            id(p): (p, group)
            for group in optimizer.param_groups
            for p in group["params"]
            if (home := self._home(p)) is None or id(home) not in live
        }
        self._groups.update(seen)

    def _follow(self, optimizer: torch.optim.Optimizer) -> None:
        """Home groups replaced by new dicts (see :func:`successors`) are followed there,
        so frozen parameters still go home after ``accelerator.prepare``."""
        live = {id(g) for g in optimizer.param_groups}
        dead = {id(g): g for _, g in self._groups.values() if id(g) not in live}
        if not dead:
            return
        moved = dict(zip(dead, successors(optimizer, list(dead.values())), strict=True))
        for key, (p, group) in list(self._groups.items()):
            if (twin := moved.get(id(group))) is not None:
                self._groups[key] = (p, twin)

    def index(self, optimizer: torch.optim.Optimizer, p: nn.Parameter) -> int | None:
        """Where ``p``'s home group is in ``optimizer.param_groups``; None without one."""
        return self.indexer(optimizer)(p)

    def indexer(self, optimizer: torch.optim.Optimizer) -> Callable[[nn.Parameter], int | None]:
        """:meth:`index` for many parameters: the groups' positions are looked up once."""
        position: dict[int, int] = {}
        for i, group in enumerate(optimizer.param_groups):
            position.setdefault(id(group), i)

        def index(p: nn.Parameter) -> int | None:
            home = self._home(p)
            return None if home is None else position.get(id(home))

        return index

    def settle(self, params: Sequence[nn.Parameter], group: dict, tx: Transaction) -> None:
        """Make ``group`` the home of ``params``; undone with the command."""
        old = [(p, self._groups.get(id(p))) for p in params]

        def restore() -> None:
            for p, entry in old:
                if entry is None:
                    self._groups.pop(id(p), None)
                else:
                    self._groups[id(p)] = entry

        tx.add(restore)
        for p in params:
            self._groups[id(p)] = (p, group)

    def swap(self, replaced: Mapping[int, nn.Parameter]) -> None:
        """Parameters replaced by others (by ``id`` of the old one: fully_shard's
        DTensors) keep their home groups."""
        for old, new in replaced.items():
            entry = self._groups.pop(old, None)
            if entry is not None:
                self._groups[id(new)] = (new, entry[1])


def homes(optimizer: torch.optim.Optimizer) -> Homes:
    """The home groups of ``optimizer``'s parameters, first seen now if never before."""
    book = REGISTRY.homes.get(optimizer)
    if book is None:
        book = REGISTRY.homes[optimizer] = Homes()
    book.observe(optimizer)
    return book


def homed(optimizer: torch.optim.Optimizer, params: Sequence[nn.Parameter]) -> int:
    """How many of ``params`` have a home group in ``optimizer`` (they left it frozen);
    an optimizer no command has edited has no book, so no homes."""
    book = REGISTRY.homes.get(optimizer)
    if book is None:
        return 0
    index = book.indexer(optimizer)
    return sum(1 for p in params if index(p) is not None)


def rehome(optimizer: torch.optim.Optimizer, replaced: Mapping[int, nn.Parameter]) -> None:
    """``optimizer``'s home groups follow parameters replaced by others (see Homes.swap)."""
    book = REGISTRY.homes.get(optimizer)
    if book is not None:
        book.swap(replaced)


def group_index(optimizer: torch.optim.Optimizer) -> dict[int, int]:
    """Which param group holds each parameter, by ``id``."""
    return {id(p): i for i, g in enumerate(optimizer.param_groups) for p in g["params"]}


def group_label(group: dict, index: int) -> str:
    return str(group.get("name", index))


def _copy_group(group: dict) -> dict:
    copy = dict(group)
    copy["params"] = list(group["params"])
    if "param_names" in group:
        copy["param_names"] = list(group["param_names"])
    return copy


_MEMBERSHIP = frozenset({"params", "param_names"})


def _same(a: object, b: object) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
    try:
        return a is b or bool(a == b)
    except (RuntimeError, ValueError):  # tensors of several elements
        return False


def _changed_keys(group: dict, saved: dict) -> set[str]:
    return {k for k in group.keys() | saved.keys() if not _same(group.get(k), saved.get(k))}


def _new_since(
    optimizer: torch.optim.Optimizer, groups: Sequence[dict], saved: Sequence[dict]
) -> tuple[list[dict], list[nn.Parameter]]:
    """The param groups (by identity) and parameters in ``optimizer`` that were not in
    ``groups`` / the ``saved`` copies of them."""
    old = {id(g) for g in groups}
    held = {id(p) for copy in saved for p in copy["params"]}
    new_groups = [g for g in optimizer.param_groups if id(g) not in old]
    new_params = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in held]
    return new_groups, new_params


def _later(optimizer: torch.optim.Optimizer, groups: Sequence[dict], ours: Sequence[dict]):
    """Groups in ``optimizer`` that are neither ``groups`` nor ``ours``: the user's, added
    after the command."""
    known = {id(g) for g in (*groups, *ours)}
    return [g for g in optimizer.param_groups if id(g) not in known]


class OptimizerEditor:
    """Edits one optimizer inside a transaction.

    The inverse puts every group back in its place with its old members and drops the
    groups the command added, with the state of the parameters the command added. Groups
    the user added after the command stay (after the others), with their state.
    Hyper-parameters (lr, weight decay, schedule keys) go back only in groups whose
    hyper-parameters the command itself changed: a group that merely lost or gained
    members keeps the lr its scheduler has moved it to since.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, tx: Transaction, model: nn.Module) -> None:
        check_optimizer(optimizer)
        self.optimizer = optimizer
        self._tx = tx
        self._model = model
        self._names: dict[int, str] | None = None
        self._uses_param_names: bool | None = None
        self._holders: dict[int, list[dict]] | None = None
        self._by_name: dict[str, list[int]] | None = None
        self._layouts: set[bool] | None = None  # which groups carry param_names
        # parameters taken out ahead (detach_ahead) and not placed yet, and the groups
        # they left: those count as holding them until they are placed
        self._away: dict[int, list[int]] = {}
        self._pending: dict[int, int] = {}
        groups = list(optimizer.param_groups)
        saved = [_copy_group(g) for g in groups]
        # what to restore per group; until commit (a rollback) everything
        restore_keys: list[set[str] | None] = [None] * len(groups)
        made: list[tuple[list[dict], list[nn.Parameter]]] = []

        def made_here() -> tuple[list[dict], list[nn.Parameter]]:
            """The groups and parameters the command added: fixed at commit (or at a
            rollback), so groups and parameters the user adds later are not the command's."""
            if not made:
                made.append(_new_since(optimizer, groups, saved))
            return made[0]

        def keep_only_changed_keys() -> None:
            """At commit: undo restores only the groups the command changed (their
            membership alone when only that changed), not what the user sets later."""
            made_here()
            for i, (group, copy) in enumerate(zip(groups, saved, strict=True)):
                changed = _changed_keys(group, copy)
                restore_keys[i] = (
                    set()
                    if not changed
                    else (set(_MEMBERSHIP) if changed <= _MEMBERSHIP else set(copy) | changed)
                )

        def current() -> tuple[list[dict], list[dict]]:
            """The command's groups where they are now (a library may have re-created
            the dicts since), and the groups it added."""
            ours = made_here()[0]
            now = [t or g for g, t in zip(groups, successors(optimizer, groups), strict=True)]
            return now, [t for t in successors(optimizer, ours) if t is not None]

        def restore() -> None:
            added_params = made_here()[1]
            now, ours = current()
            for group, copy, keys in zip(now, saved, restore_keys, strict=True):
                if keys is None:
                    group.clear()
                    group.update(_copy_group(copy))
                    continue
                fresh = _copy_group(copy)
                for key in keys:
                    if key in fresh:
                        group[key] = fresh[key]
                    else:
                        group.pop(key, None)
            optimizer.param_groups[:] = [*now, *_later(optimizer, now, ours)]
            live = {id(p) for g in optimizer.param_groups for p in g["params"]}
            state = state_of(optimizer)
            for p in added_params:
                if id(p) not in live and p in state:
                    del state[p]

        def clash() -> str | None:
            back = {id(p) for copy in saved for p in copy["params"]}
            later = _later(optimizer, *current())
            n = sum(id(p) in back for g in later for p in g["params"])
            if not n:
                return None
            return (
                f"{n} parameter tensors it took out of the optimizer are in a param group "
                "added since: undoing would put them in two groups"
            )

        tx.add(restore)
        tx.on_commit(keep_only_changed_keys)
        tx.refuse_undo_if(clash)

    @property
    def uses_param_names(self) -> bool:
        """Whether the groups carry ``param_names`` (fixed for the command: every group
        the editor adds follows the optimizer's layout)."""
        if self._uses_param_names is None:
            self._uses_param_names = any("param_names" in g for g in self.optimizer.param_groups)
        return self._uses_param_names

    def _holding(self) -> dict[int, list[dict]]:
        """The groups holding each parameter, by ``id`` (one, unless the user put it in
        several), indexed at the first edit and kept up to date by the editor's own edits,
        so that moving one block does not scan every group."""
        if self._holders is None:
            self._holders = {}
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    holders = self._holders.setdefault(id(p), [])
                    if not holders or holders[-1] is not group:
                        holders.append(group)
        return self._holders

    def _named(self, name: str) -> list[int]:
        """Indices of the groups called ``name``, indexed once per command."""
        if self._by_name is None:
            self._by_name = {}
            for index, group in enumerate(self.optimizer.param_groups):
                if isinstance(group.get("name"), str):
                    self._by_name.setdefault(group["name"], []).append(index)
        return self._by_name.get(name, [])

    def _names_of(self, params: Sequence[nn.Parameter]) -> list[str]:
        """Qualified names, for optimizers built from ``named_parameters()`` (looked up
        only for those: walking the model is the slow part of an edit)."""
        if self._names is None:
            self._names = parameter_names(self._model)
        return [self._names[id(p)] for p in params]

    def _shown_names(self, params: Sequence[nn.Parameter]) -> list[str]:
        """Names for a refusal: a parameter not in the model yet (a new head) by shape."""
        if self._names is None:
            self._names = parameter_names(self._model)
        return [self._names.get(id(p), f"a {list(p.shape)} tensor") for p in params]

    def detach(self, params: Sequence[nn.Parameter]) -> None:
        """Take ``params`` out of whatever groups hold them, keeping their state."""
        holding = self._holding()
        ids = {id(p) for p in params}
        touched = {id(g): g for p in params for g in holding.pop(id(p), ())}
        for group in touched.values():
            keep = [i for i, p in enumerate(group["params"]) if id(p) not in ids]
            if len(keep) == len(group["params"]):
                continue
            if "param_names" in group:
                group["param_names"] = [group["param_names"][i] for i in keep]
            group["params"] = [group["params"][i] for i in keep]

    def detach_ahead(self, params: Sequence[nn.Parameter]) -> None:
        """Take ``params`` out of their groups at once (each group rebuilt once) before the
        :meth:`join` / :meth:`add_group` calls that place them. A group they leave counts
        as still holding each of them until it is placed, so the groups come out exactly
        as if each had left only when placed (an emptied group is reused by name then)."""
        holding = self._holding()
        for p in params:
            left = [id(g) for g in holding.get(id(p), ())]
            if left and id(p) not in self._away:
                self._away[id(p)] = left
                for key in left:
                    self._pending[key] = self._pending.get(key, 0) + 1
        self.detach(params)

    def _placed(self, params: Sequence[nn.Parameter]) -> None:
        check_takes(self.optimizer, params, self._model, self._shown_names)
        for p in params:
            for key in self._away.pop(id(p), ()):
                self._pending[key] -= 1

    def remove(self, params: Sequence[nn.Parameter]) -> int:
        """Take ``params`` out of the optimizer and set their state aside on the host;
        the groups they leave become their home groups.

        Returns the bytes of state freed from the accelerator (0 on the CPU). The state
        comes back bit for bit when the command is undone: tensors that lived with their
        parameter return to wherever the parameter is then (it may have been moved with
        %device move since), the others (e.g. Adam's host-side ``step``) where they were.
        """
        where = group_index(self.optimizer)
        book = homes(self.optimizer)
        leaving: dict[int, list[nn.Parameter]] = {}
        for p in params:
            if id(p) in where:
                leaving.setdefault(where[id(p)], []).append(p)
        for index in sorted(leaving):
            book.settle(leaving[index], self.optimizer.param_groups[index], self._tx)
        state = state_of(self.optimizer)
        stash: list[tuple[nn.Parameter, dict]] = []
        freed = 0
        for p in params:
            if p not in state:  # `state` is a defaultdict: never index it blindly
                continue
            kept: dict[str, tuple[object, torch.device | None]] = {}
            group = self.optimizer.param_groups[where[id(p)]] if id(p) in where else {}
            for key, value in state[p].items():
                if not isinstance(value, torch.Tensor):
                    kept[key] = (value, None)
                    continue
                if value.device.type != "cpu":
                    freed += local_nbytes(value)
                follows = value.device == p.device and not step_stays_on_host(group, key)
                home = None if follows else value.device
                kept[key] = (to_host(value), home)  # a DTensor as its local shard
            stash.append((p, kept))

        def restore_state() -> None:
            state = state_of(self.optimizer)  # load_state_dict may have replaced the dict
            for p, kept in stash:
                state[p] = {k: from_host(v, home or p.device) for k, (v, home) in kept.items()}

        self._tx.add(restore_state)  # before anything leaves the optimizer
        self._tx.hold(
            held(v)
            for _, kept in stash
            for v, _ in kept.values()
            if isinstance(v, (torch.Tensor, HostShard))
        )
        self.detach(params)
        for p, _ in stash:
            del state[p]
        return freed

    def add_group(
        self,
        params: Sequence[nn.Parameter],
        *,
        name: str,
        lr: float,
        template: dict,
        weight_decay: float | None = None,
    ) -> int:
        """Put ``params`` in a group called ``name`` at ``lr`` and return its index.

        The group takes ``template``'s hyper-parameters (a home group, or the optimizer's
        ``defaults``). An existing empty group of that name is reused (freeze/unfreeze
        cycles do not pile up groups).
        """
        self.detach(params)
        self._placed(params)
        groups = self.optimizer.param_groups
        settings = hyperparameters(template)
        if weight_decay is not None:
            settings["weight_decay"] = weight_decay
        for index in self._named(name):
            group = groups[index]
            if (
                group.get("name") == name
                and not group["params"]
                and not self._pending.get(id(group))
            ):
                group.update(settings, lr=lr)
                self.join(index, params)
                return index
        new = dict(settings)
        new["params"] = (
            list(zip(self._names_of(params), params, strict=True))
            if self.uses_param_names
            else list(params)
        )
        new.update(lr=lr, name=name)
        if self._layouts is None:
            self._layouts = {"param_names" in g for g in groups}
        _append_group(self.optimizer, new, self._layouts)
        index = len(groups) - 1
        self._layouts.add("param_names" in groups[index])
        for p in params:
            self._holding()[id(p)] = [groups[index]]
        if self._by_name is not None:
            self._by_name.setdefault(name, []).append(index)
        return index

    def join(self, index: int, params: Sequence[nn.Parameter]) -> None:
        """Move ``params`` into the existing group ``index`` (after its own members)."""
        self.detach(params)
        self._placed(params)
        group = self.optimizer.param_groups[index]
        group["params"] = [*group["params"], *params]
        if "param_names" in group:
            group["param_names"] = [*group["param_names"], *self._names_of(params)]
        for p in params:
            self._holding()[id(p)] = [group]


def _append_group(optimizer: torch.optim.Optimizer, group: dict, layouts: set[bool]) -> None:
    """``optimizer.add_param_group(group)`` for a group whose parameters are in no other.

    torch's own method re-reads every group's members to check that: over thousands of
    new groups, quadratic. Where the optimizer uses torch's method unchanged, it checks
    against empty stand-ins with the groups' ``param_names`` ``layouts`` (with, without)
    instead, so it still refuses a mixed layout, and fills in the defaults as always.
    """
    groups = optimizer.param_groups
    plain = (
        type(optimizer).add_param_group is torch.optim.Optimizer.add_param_group
        and vars(optimizer).get("param_groups") is groups
    )
    if not plain:
        optimizer.add_param_group(group)
        return
    stand_ins: list[dict] = [
        {"params": [], "param_names": []} if named else {"params": []} for named in sorted(layouts)
    ]
    optimizer.param_groups = stand_ins
    try:
        optimizer.add_param_group(group)
    finally:
        optimizer.param_groups = groups
    groups.extend(stand_ins[len(layouts) :])
