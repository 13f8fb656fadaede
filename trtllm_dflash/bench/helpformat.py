# SPDX-License-Identifier: Apache-2.0
"""``--help`` layout of the dflash-* commands: examples kept as written, defaults shown where there is one."""
from __future__ import annotations

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Raw description and epilog (the examples stay one per line); ``(default: X)`` except for flags and None
    defaults, whose help text says what happens."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.nargs == 0 or action.default in (None, argparse.SUPPRESS, ""):
            return action.help or ""
        return super()._get_help_string(action)
