# SPDX-License-Identifier: Apache-2.0
"""--help of the console scripts: examples one per line as written, defaults shown once and only where they say
something, no line a terminal has to wrap twice."""
from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from trtllm_dflash import cli
from trtllm_dflash.bench.helpformat import shows_default

COMMANDS = {"dflash-build": cli.build_main, "dflash-train": cli.train_main, "dflash-serve": cli.serve_main,
            "dflash-client": cli.client_main, "dflash-generate": cli.generate_main, "dflash-sweep": cli.sweep_main,
            "dflash-plot": cli.plot_main, "dflash-openai": cli.openai_main}


def help_text(main) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["--help"])
    return out.getvalue()


@pytest.mark.parametrize("name", COMMANDS)
def test_help_keeps_examples_and_prints_each_default_once(name):
    text = help_text(COMMANDS[name])
    lines = text.splitlines()
    assert max(map(len, lines)) <= 120, max(lines, key=len)
    for bad in ("(default: None)", "(default: True)", "(default: False)", "(default: )", "] (default:"):
        assert bad not in text, bad
    examples = lines[lines.index("examples:") + 1:]
    commands = [ln for ln in examples if ln.lstrip().startswith(name + " ")]
    assert len(commands) >= 2 and all(ln.startswith("  ") for ln in commands)   # one per line, not reflowed
    # a continued example keeps its backslash at the end of the line (never joined into one long line)
    assert all(ln.rstrip().endswith("\\") or "\\ " not in ln for ln in examples)


def test_build_help_example_is_whole_and_gpu_is_explained():
    text = help_text(cli.build_main)
    assert "--out engines/qwen3-8b/tp2" in text and "--out e\n" not in text
    assert "not this machine's" in " ".join(text.split())


@pytest.mark.parametrize("name", COMMANDS)
def test_help_names_every_default(name, monkeypatch):
    """dflash-openai --port showed no default (8000, the port dflash-serve takes too), nor did dflash-generate's
    options without help text (argparse prints no help line for them at all)."""
    parsers = []
    print_help = argparse.ArgumentParser.print_help
    monkeypatch.setattr(argparse.ArgumentParser, "print_help",
                        lambda self, file=None: (parsers.append(self), print_help(self, file))[1])
    help_text(COMMANDS[name])
    parser = parsers[-1]
    silent = [a.option_strings[0] for a in parser._actions
              if a.option_strings and a.help is not argparse.SUPPRESS and shows_default(a)
              and "default" not in parser._get_formatter()._format_action(a).lower()]
    assert silent == [], f"{name}: no default shown for {silent}"


@pytest.mark.parametrize("name", COMMANDS)
def test_durations_say_their_unit(name, monkeypatch):
    """Durations are seconds named ``_s`` (dflash-client and dflash-sweep had a bare --timeout, dflash-serve a
    --ready_timeout, beside --drain_timeout_s); one named after another tool's flag says so in its help."""
    parsers = []
    print_help = argparse.ArgumentParser.print_help
    monkeypatch.setattr(argparse.ArgumentParser, "print_help",
                        lambda self, file=None: (parsers.append(self), print_help(self, file))[1])
    help_text(COMMANDS[name])
    unitless = [a.option_strings[0] for a in parsers[-1]._actions if a.option_strings
                and ("timeout" in a.option_strings[0] or (a.help or "").lower().startswith("seconds"))
                and not a.option_strings[0].endswith("_s") and "named after" not in (a.help or "")]
    assert unitless == [], f"{name}: {unitless} do not say their unit"


def test_the_old_timeout_flags_still_parse():
    from trtllm_dflash.bench import sweep
    from trtllm_dflash.serving import client

    assert sweep.parse_args(["--timeout", "5", "--out", "rows.jsonl"]).timeout_s == 5
    assert client.parse_args(["Hello", "--timeout", "7"]).timeout_s == 7
