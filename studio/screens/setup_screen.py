"""The setup screen: every knob a run needs, validated as you type (the CLI's own one-line
messages, shown beside the field), with the VRAM panel recomputed on each change."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Label, Select, SelectionList, Static

from ...contract import config as cfgmod
from ...contract.config import Config
from ...contract.dtypes import DTYPES
from ...contract.errors import UserError, show
from .. import hardware, models, vram_adapter
from ..messages import AskUser, LaunchRequested
from ..rewards_info import builtin_rewards
from ..widgets.reward_list import RewardList
from ..widgets.vram_panel import VramPanel

DTYPE_HINTS = {name: d.hint for name, d in DTYPES.items()}

# (key, label, kind): kind is "input", "select", "check"; selects take their choices from the key table.
FIELDS = [
    ("model.name", "model", "model"),
    ("model.dtype", "dtype", "select"),
    ("rollout.backend", "rollout engine", "select"),
    ("rollout.dtype", "rollout dtype", "select"),
    ("model.lora_rank", "LoRA rank", "input"),
    ("model.lora_alpha", "LoRA alpha", "input"),
    ("model.load_in_4bit", "4-bit base", "check"),
    ("model.gradient_checkpointing", "grad ckpt", "check"),
    ("rewards.funcs", "rewards", "rewards"),
    ("data.source", "dataset", "input"),
    ("algo.name", "algorithm", "select"),
    ("algo.beta", "KL beta", "input"),
    ("rollout.num_generations", "generations", "input"),
    ("rollout.max_prompt_len", "max prompt len", "input"),
    ("rollout.max_completion_len", "max completion", "input"),
    ("train.prompts_per_step", "prompts/step", "input"),
    ("train.lr", "learning rate", "input"),
    ("train.steps", "steps", "input"),
    ("rollout.temperature", "temperature", "input"),
]


def tooltip(info: cfgmod.KeyInfo) -> str:
    """A field's config key (as --set and TOML spell it), its help and its default."""
    return "\n".join(filter(None, [info.key, info.help, f"default: {show(info.default)}"]))


def field_id(key: str) -> str:
    return "f-" + key.replace(".", "-").replace("_", "-")


@functools.cache
def key_table() -> dict[str, cfgmod.KeyInfo]:
    """The contract's public key table (config.key_info), by key."""
    return {info.key: info for info in cfgmod.key_info()}


def choices(key: str) -> tuple:
    """A select field's allowed values."""
    return key_table()[key].choices


def get_value(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def as_text(value) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


class SetupScreen(Screen):
    BINDINGS = [
        Binding("ctrl+r", "launch", "Launch", id="setup.launch"),
        Binding("ctrl+b", "rehearse", "Rehearse", id="setup.rehearse"),  # r would type into the fields
        Binding("ctrl+s", "save", "Save", id="setup.save"),
        Binding("ctrl+o", "load", "Load", id="setup.load"),
        Binding("ctrl+t", "toggle_mode", "VRAM mode", id="setup.vram_mode"),
    ]

    mode: reactive[str] = reactive("documented", init=False)  # the VRAM estimate: documented or accurate

    def __init__(self, cfg: Config, source: str = "", **kwargs):
        super().__init__(**kwargs)
        self.base = cfg
        self.cfg = copy.deepcopy(cfg)
        self.source = source
        self.errors: dict[str, str] = {}
        gpus = hardware.gpus()
        self.gpu_count = len(gpus)
        self.gpu_gib = gpus[0].total_gib if gpus else None
        self.gpu_label = f"GPU: {hardware.gpu_summary()}"
        self.plan_count = 0
        self.builtins = builtin_rewards()
        self.builtin_names = {name for name, _ in self.builtins}
        self._ready = False
        self._pending = False

    # ---- layout -----------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="setup-body"):
            with VerticalScroll(id="setup-form"):
                for key, label, kind in FIELDS:
                    yield from self._field(key, label, kind)
                yield Static("", id="form-error", classes="error")
            with Vertical(id="vram-side"):
                yield VramPanel(id="vram")
                with Horizontal(id="gpu-row", classes="row"):
                    yield Label("GPU GiB", classes="label")
                    yield Input(self._gpu_text(), id="gpu-gib", compact=True, placeholder="size to check against")
                if self.gpu_count > 1:  # data parallel: `grpo-studio train --nproc N`, one process per GPU
                    with Horizontal(id="devices-row", classes="row"):
                        yield Label("devices", classes="label")
                        yield Select(
                            [(str(n), n) for n in range(1, self.gpu_count + 1)],
                            value=1,
                            allow_blank=False,
                            id="devices",
                            compact=True,
                        )
        yield Footer()

    def _gpu_text(self) -> str:
        return f"{self.gpu_gib:g}" if self.gpu_gib else "24"

    def _field(self, key: str, label: str, kind: str) -> ComposeResult:
        value = get_value(self.cfg, key)
        fid = field_id(key)
        with Vertical(classes="field", id=f"{fid}-box"):
            with Horizontal(classes="row"):
                yield Label(label, classes="label")
                if kind == "select":
                    opts = [("same as model" if c == "" else c, c) for c in choices(key)]
                    yield Select(opts, value=value, allow_blank=False, id=fid, compact=True)
                elif kind == "model":
                    yield Select(
                        [(lbl, v) for lbl, v in models.model_choices(value)],
                        value=value,
                        allow_blank=False,
                        id=fid,
                        compact=True,
                    )
                elif kind == "check":
                    yield Select(
                        [("no", False), ("yes", True)], value=bool(value), allow_blank=False, id=fid, compact=True
                    )
                elif kind == "rewards":
                    opts = [(f"{name}: {about}", name, name in value) for name, about in self.builtins]
                    yield RewardList(*opts, id=fid, classes="rewards")
                else:
                    yield Input(as_text(value), id=fid, compact=True, select_on_focus=False)
            if kind == "rewards":  # the list shows 6 rows: what is selected, always in view
                yield Static("", id="rewards-summary", classes="hint")
            if kind == "model":
                with Horizontal(classes="row"):
                    yield Label("…or path/hub", classes="label")
                    yield Input("", id="f-model-custom", compact=True, placeholder="local folder or org/name")
            if kind == "rewards":
                with Horizontal(classes="row"):
                    yield Label("+ file.py:fn", classes="label")
                    extra = [f for f in value if f not in self.builtin_names]
                    yield Input(
                        ", ".join(extra), id="f-rewards-extra", compact=True, placeholder="my_rewards.py:score, …"
                    )
            if key == "model.dtype":
                yield Static(DTYPE_HINTS.get(value, ""), id="dtype-hint", classes="hint")
            yield Static("", id=f"{fid}-error", classes="error")

    def on_mount(self) -> None:
        self.sub_title = f"setup · {self.source or 'defaults'}"
        for key, _, _ in FIELDS:
            self.query_one(f"#{field_id(key)}").tooltip = tooltip(key_table()[key])
        self._ready = True
        self.recompute()

    # ---- reading the form -------------------------------------------------------------------
    def _raw(self, key: str):
        widget = self.query_one(f"#{field_id(key)}")
        if key == "model.name":
            custom = self.query_one("#f-model-custom", Input).value.strip()
            return custom or widget.value
        if key == "rewards.funcs":
            extra = [s.strip() for s in self.query_one("#f-rewards-extra", Input).value.split(",") if s.strip()]
            return list(widget.selected) + extra
        return widget.value

    def nproc(self) -> int:
        """The devices the run trains on (the devices select; 1 without more than one GPU)."""
        return int(self.query_one("#devices", Select).value) if self.gpu_count > 1 else 1

    def build_config(self) -> tuple[Config, dict[str, str], str]:
        """The config the form describes, per-field errors (CLI wording), and a cross-field error."""
        cfg = copy.deepcopy(self.base)
        errors: dict[str, str] = {}
        algo = self._raw("algo.name")
        if algo != self.base.algo.name:  # the preset's defaults, then the form's fields over them
            cfgmod.choose_algorithm(cfg, algo)
        for key, _, kind in FIELDS:
            try:
                raw = self._raw(key)
                cfgmod.set_key(cfg, key, raw, from_text=kind in ("input", "model"))
            except UserError as err:
                errors[key] = str(err)
        if "rewards.funcs" not in errors and cfg.rewards.weights and len(cfg.rewards.weights) != len(cfg.rewards.funcs):
            cfg.rewards.weights = []
        general = ""
        nproc = self.nproc()
        if nproc > 1 and cfg.train.parallel == "none":  # `train --nproc N` needs data parallelism
            cfgmod.set_key(cfg, "train.parallel", "ddp")
        if not errors:
            try:
                cfgmod.validate(cfg)
            except UserError as err:
                general = str(err)
        if not errors and not general:
            try:
                cfgmod.check_processes(cfg, nproc)  # the launch rule, in its one home
            except UserError as err:
                general = str(err)
        return cfg, errors, general

    @on(Input.Changed)
    @on(Select.Changed)
    @on(SelectionList.SelectedChanged)
    def _changed(self, event) -> None:
        if self._ready and not self._pending:
            self._pending = True  # coalesce a burst of change events into one recompute
            self.call_after_refresh(self._recompute_pending)

    def _recompute_pending(self) -> None:
        self._pending = False
        self.recompute()

    def recompute(self) -> None:
        cfg, errors, general = self.build_config()
        self.errors = errors
        for key, _, _ in FIELDS:
            box = self.query_one(f"#{field_id(key)}-error", Static)
            box.update(errors.get(key, ""))
            box.display = key in errors
        form_error = self.query_one("#form-error", Static)
        form_error.update(general)
        form_error.display = bool(general)
        self.query_one("#dtype-hint", Static).update(DTYPE_HINTS.get(str(self._raw("model.dtype")), ""))
        self.query_one("#rewards-summary", Static).update(self.rewards_summary())
        if not errors:
            self.cfg = cfg
        self.general_error = general
        try:
            gpu = float(self.query_one("#gpu-gib", Input).value or 0) or None
        except ValueError:
            gpu = None
        label = self.gpu_label if self.gpu_gib else "no GPU found: vs GPU GiB below"
        self.plan = vram_adapter.plan(self.cfg, self.mode, gpu, world_size=self.nproc())
        self.plan_count += 1
        self.query_one(VramPanel).show(self.plan, label)

    def rewards_summary(self) -> str:
        """ "rewards: correctness, format (2 of 12 built-in)", user functions (file.py:fn) named too."""
        names = self._raw("rewards.funcs")
        picked = len(self.query_one(RewardList).selected)
        return f"rewards: {', '.join(names) or 'none'} ({picked} of {len(self.builtins)} built-in)"

    @on(events.DescendantFocus, "#f-rewards-funcs")
    def _show_rewards_box(self) -> None:
        """Focusing the list scrolls its whole field into view: label, list, summary, user functions."""
        self.call_after_refresh(self.query_one("#f-rewards-funcs-box").scroll_visible, animate=False)

    # ---- actions ----------------------------------------------------------------------------
    def action_toggle_mode(self) -> None:
        self.mode = "accurate" if self.mode == "documented" else "documented"

    def watch_mode(self) -> None:
        self.recompute()

    def valid_config(self) -> Config | None:
        self.recompute()
        bad = next((k for k, _, _ in FIELDS if k in self.errors), None)
        if bad or self.general_error:
            self.notify(
                self.errors.get(bad, self.general_error) if bad else self.general_error,
                title="fix the setup first",
                severity="error",
            )
            if bad:
                self.query_one(f"#{field_id(bad)}").focus()
            return None
        return self.cfg

    def action_rehearse(self) -> None:
        """Launch as ctrl+r does, the run starting with one rehearsal step on its longest prompt at the longest
        completion (`train --rehearse`): its peak memory next to the planner's, in the run's events."""
        self.action_launch(rehearse=True)

    def action_launch(self, rehearse: bool = False) -> None:
        """Launch after the pre-flight check (contract/planner/preflight.py); a run it refuses launches only
        when the user answers yes to "launch anyway"."""
        from ...contract.planner import preflight
        from .modals import Confirm

        cfg = self.valid_config()
        if cfg is None:
            return
        verdict = preflight.check(cfg, preflight.devices(), world_size=self.nproc())
        nproc = self.nproc()
        if verdict.fits:
            self.post_message(LaunchRequested(cfg, nproc=nproc, rehearse=rehearse))
            return

        def done(yes: bool | None) -> None:
            if yes:
                self.post_message(LaunchRequested(cfg, force=True, nproc=nproc, rehearse=rehearse))

        self.post_message(AskUser(Confirm(f"Pre-flight: {verdict.message}. Launch anyway?"), done))

    def action_save(self) -> None:
        from .modals import PathPrompt

        def done(path: str | None) -> None:
            if path:
                cfg = self.valid_config()
                if cfg is not None:
                    cfgmod.save(cfg, Path(path))
                    self.notify(f"saved {path}")

        self.post_message(AskUser(PathPrompt("Save setup as TOML", "setup.toml"), done))

    def action_load(self) -> None:
        from .modals import PathPrompt

        def done(path: str | None) -> None:
            if path:
                self.load_file(path)

        self.post_message(AskUser(PathPrompt("Load setup (TOML or recipe name)", "setup.toml"), done))

    def load_file(self, path: str) -> None:
        try:
            cfg = cfgmod.load(path)
        except UserError as err:
            self.notify(str(err), severity="error")
            return
        self.base, self.cfg, self.source = cfg, copy.deepcopy(cfg), path
        self._ready = False
        for key, *_ in FIELDS:
            self._set_widget(key, get_value(cfg, key))
        self._ready = True
        self.sub_title = f"setup · {path}"
        self.call_after_refresh(self.recompute)

    def _set_widget(self, key: str, value) -> None:
        widget = self.query_one(f"#{field_id(key)}")
        if key == "model.name":
            choices = models.model_choices(value)
            widget.set_options(choices)
            widget.value = value
            self.query_one("#f-model-custom", Input).value = ""
        elif key == "rewards.funcs":
            widget.deselect_all()
            for name in value:
                if name in self.builtin_names:
                    widget.select(name)
            self.query_one("#f-rewards-extra", Input).value = ", ".join(v for v in value if v not in self.builtin_names)
        elif isinstance(widget, Input):
            widget.value = as_text(value)
        else:
            widget.value = value
