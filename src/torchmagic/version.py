"""The package's version, its one source: a plain assignment that ``pyproject.toml`` reads
without importing torchmagic, in a module of its own so that the engine can name the
version it writes (checkpoints, exported scripts) without importing the package root."""

__version__ = "0.1.0"
