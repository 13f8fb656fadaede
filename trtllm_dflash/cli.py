# SPDX-License-Identifier: Apache-2.0
"""Console scripts. Each one imports its stage lazily (torch, tritonclient, ... load only when needed)
and turns a DFlashError into one line on stderr and exit code 2."""
from __future__ import annotations

import importlib
import sys

from .errors import exit_code


def _run(module: str, argv: list[str] | None) -> int:
    try:
        return exit_code(importlib.import_module(module, __package__).main, argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def generate_main(argv: list[str] | None = None) -> int:
    return _run(".generate", argv)


def build_main(argv: list[str] | None = None) -> int:
    return _run(".build", argv)


def serve_main(argv: list[str] | None = None) -> int:
    return _run(".serving.server", argv)


def client_main(argv: list[str] | None = None) -> int:
    return _run(".serving.client", argv)


def openai_main(argv: list[str] | None = None) -> int:
    return _run(".serving.openai_server", argv)


def sweep_main(argv: list[str] | None = None) -> int:
    return _run(".bench.sweep", argv)


def plot_main(argv: list[str] | None = None) -> int:
    return _run(".bench.plot", argv)


def train_main(argv: list[str] | None = None) -> int:
    return _run(".train", argv)
