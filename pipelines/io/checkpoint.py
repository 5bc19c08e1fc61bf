"""The streaming checkpoints' compatibility with the config: a restart may change thresholds, limits and the
trigger, but not the settings the saved stream state depends on."""

from __future__ import annotations

import json
from pathlib import Path

from pipelines.config import ConfigError, GovernorConfig

#: Settings a checkpoint depends on: changing one makes the saved stream state meaningless.
CHECKPOINT_BOUND_SETTINGS = {
    "windows.length_seconds": lambda cfg: cfg.windows.length_seconds,
    "source.kind": lambda cfg: cfg.source.kind,
}
CHECKPOINT_SETTINGS_FILE = "governor-settings.json"


class CheckpointMismatchError(ConfigError):
    """The config changes a setting the existing checkpoint depends on (e.g. the window length)."""


def check_checkpoint(cfg: GovernorConfig) -> None:
    """Refuse a restart whose config is incompatible with the existing checkpoint; record the settings on first
    start. Other settings (thresholds, limits, trigger) may change between restarts.

    Raises:
        CheckpointMismatchError: names the setting, both values and what to do.
    """
    root = Path(cfg.checkpoint_root)
    current = {name: read(cfg) for name, read in CHECKPOINT_BOUND_SETTINGS.items()}
    saved_file = root / CHECKPOINT_SETTINGS_FILE
    if saved_file.is_file():
        saved = json.loads(saved_file.read_text())
        for name, value in current.items():
            if name in saved and saved[name] != value:
                raise CheckpointMismatchError(
                    f"{name} is {value} but the checkpoint in {root} was made with {saved[name]}; restore "
                    f"{name} = {saved[name]!r}, or start a new stream with another lake.checkpoint_dir "
                    "(and a new lake, since windows of both lengths would mix)"
                )
        return
    if root.exists() and any(root.iterdir()):
        return  # a checkpoint from before settings were recorded: nothing to compare against
    root.mkdir(parents=True, exist_ok=True)
    saved_file.write_text(json.dumps(current, indent=2) + "\n")
