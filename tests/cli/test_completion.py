"""Shell completion: 'gpusched completion SHELL' sets it up for every command, and the
commands answer the shell's questions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpusched.cli.common import COMMANDS

BIN = Path(sys.executable).parent


def completion(shell: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "gpusched"), "completion", shell], capture_output=True,
                          text=True, timeout=60)


def test_every_command_gets_completion_in_every_shell() -> None:
    bash, zsh, fish = (completion(shell).stdout for shell in ("bash", "zsh", "fish"))
    for prog in COMMANDS:
        assert f"complete -o default -F _{prog}_completion {prog}" in bash
        assert f"compdef _{prog}_completion {prog}" in zsh
        assert f"complete --command {prog} " in fish
    bad = completion("tcsh")
    assert bad.returncode == 2 and "invalid shell 'tcsh'" in bad.stderr


@pytest.mark.parametrize(("words", "expected"), [
    ("gqueue --sta", {"--states", "--start"}),
    ("gsubmit --nodel", {"--nodelist"}),
    ("gcancel --si", {"--signal"}),
    ("gcontrol up", {"update"}),
    ("gpusched comp", {"completion"}),
])
def test_bash_completes_options_and_subcommands(words: str, expected: set[str]) -> None:
    """Bash itself runs the completion function, as on pressing TAB."""
    prog = words.split()[0]
    script = (f'PATH="{BIN}:$PATH"; eval "$(gpusched completion bash)"; COMP_WORDS=({words}); '
              f'COMP_CWORD={len(words.split()) - 1}; _{prog}_completion {prog}; '
              'printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == expected


def leaf_commands() -> list[tuple[str, object]]:
    """(name, click command) of every command a user can run, subcommands included."""
    from importlib import import_module

    from typer.main import get_command

    found: list[tuple[str, object]] = []

    def walk(name: str, command: object) -> None:
        children = getattr(command, "commands", None)
        if children:
            for child_name, child in children.items():
                walk(f"{name} {child_name}", child)
        else:
            found.append((name, command))

    for prog in COMMANDS:
        walk(prog, get_command(import_module(f"gpusched.cli.{prog}").app))
    return found


def test_every_command_has_help_with_examples() -> None:
    missing = [name for name, command in leaf_commands()
               if "Example" not in f"{getattr(command, 'help', '')}{getattr(command, 'epilog', '')}"]
    assert missing == []
