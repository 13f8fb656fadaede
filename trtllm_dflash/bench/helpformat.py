# SPDX-License-Identifier: Apache-2.0
"""``--help`` layout of the dflash-* commands: examples kept as written, defaults shown where there is one."""
from __future__ import annotations

import argparse
import copy


def shows_default(action: argparse.Action) -> bool:
    """Flags, None and empty defaults say nothing as ``(default: X)``: their help text says what happens."""
    return not (action.nargs == 0 or action.default in (None, argparse.SUPPRESS, "") or action.default == [])


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Raw description and epilog (the examples stay one per line); ``(default: X)`` except where
    ``shows_default`` says it means nothing, and also for an option without help text (argparse prints no help
    line at all for those, so ``--max_batch_size`` would show no default)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if not shows_default(action):
            return action.help or ""
        return super()._get_help_string(action)

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and action.option_strings and shows_default(action):
            action = copy.copy(action)
            action.help = "default: %(default)s"
        return super()._format_action(action)
