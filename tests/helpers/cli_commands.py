"""The commands of the `bulkrun` typer app, nested ones (`batch prepare`) included."""

from __future__ import annotations

import typer.main

from bulkrun.cli import app


def commands() -> dict[tuple[str, ...], object]:
    """Each command's path (("generate",), ("batch", "prepare"), ...) -> its click command."""
    found = {}

    def walk(group, path):
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                walk(command, (*path, name))
            else:
                found[(*path, name)] = command

    walk(typer.main.get_command(app), ())
    return found


def command_paths() -> list[tuple[str, ...]]:
    return sorted(commands())
