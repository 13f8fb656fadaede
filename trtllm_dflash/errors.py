# SPDX-License-Identifier: Apache-2.0
"""The one error type users see: it names the field at fault and the fix."""


class DFlashError(ValueError):
    """A user-facing error. ``str(err)`` is one line: ``<field>: <problem>. Fix: <fix>``."""

    def __init__(self, field: str, problem: str, fix: str = ""):
        self.field, self.problem, self.fix = field, problem, fix
        msg = f"{field}: {problem}"
        super().__init__(f"{msg}. Fix: {fix}" if fix else msg)


def exit_code(main, argv=None) -> int:
    """Run a command's ``main(argv)``; a DFlashError becomes one line on stderr and exit code 2."""
    import sys
    try:
        return main(argv) or 0
    except DFlashError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
