"""Help for every command, readable on an 80-column terminal; every option declared once, in
bulkrun/cli/options.py, and reused by the commands that take it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers.cli_commands import command_paths, commands

import bulkrun.cli
from bulkrun import exceptions

CLI = Path(bulkrun.cli.__file__).parent
DECLARATIONS = {
    "Option",
    "Argument",
    "_option",
}  # typer.Option(...), typer.Argument(...), options._option(...)


@pytest.mark.parametrize("path", command_paths(), ids=" ".join)
def test_every_command_and_option_has_help_text(path):
    command = commands()[path]
    assert (command.help or "").strip(), f"{' '.join(path)} has no help text"
    missing = [p.name for p in command.params if p.param_type_name == "option" and not (p.help or "").strip()]
    assert missing == [], f"options of {' '.join(path)} without help: {missing}"


@pytest.mark.parametrize("args", [(), ("batch",), *command_paths()], ids=lambda a: " ".join(a) or "bulkrun")
def test_help_fits_80_columns(bulkrun, args):
    code, out, _ = bulkrun(*args, "--help")  # typer's CliRunner formats at 80 columns, as a terminal would
    assert code == 0 and "Usage" in out
    assert [line for line in out.splitlines() if len(line) > 80] == []


def _declared_flags(path: Path) -> list[tuple[str, int]]:
    """The flags (and argument metavars) each option declaration in `path` names, with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in DECLARATIONS:
                decls = [
                    a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                ]
                decls += [
                    k.value.value
                    for k in node.keywords
                    if k.arg == "metavar" and isinstance(k.value, ast.Constant)
                ]
                found.extend((decl, node.lineno) for decl in decls or ["<unnamed>"])
    return found


def test_every_option_is_declared_once_in_the_options_module():
    elsewhere = {
        f"{path.name}:{line} {flag}"
        for path in sorted(CLI.glob("*.py"))
        if path.name not in ("options.py", "app.py")  # app.py: the app's own --version
        for flag, line in _declared_flags(path)
    }
    assert elsewhere == set(), "declare options in bulkrun/cli/options.py and reuse the alias"
    flags = [flag for flag, _ in _declared_flags(CLI / "options.py") if flag.startswith("-")]
    assert len(flags) > 60 and sorted({f for f in flags if flags.count(f) > 1}) == []


def test_the_check_sees_a_second_declaration(tmp_path):
    """The walk itself can fail: a command module declaring its own --out is found."""
    module = tmp_path / "cmd.py"
    module.write_text('import typer\nOut = typer.Option("--out", "-o", help="x")\n')
    assert _declared_flags(module) == [("--out", 2), ("-o", 2)]


def test_a_shared_option_is_the_same_option_in_every_command():
    """Reused aliases give every command the same flag, help and metavar for one spec key."""
    seen: dict[str, tuple] = {}
    for path, command in commands().items():
        for param in command.params:
            if param.param_type_name != "option":
                continue
            shape = (tuple(param.opts), tuple(param.secondary_opts), param.help, param.metavar)
            assert seen.setdefault(param.name, shape) == shape, f"{' '.join(path)} --{param.name}"


def test_the_top_level_help_lists_every_exit_code(bulkrun):
    constants = {v for k, v in vars(exceptions).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert set(exceptions.EXIT_CODES) == constants  # every code has its line
    _, out, _ = bulkrun("--help")
    lines = [line.split(None, 1) for line in out.split("Exit codes")[1].splitlines()[1:] if line.strip()]
    assert {int(code): meaning for code, meaning in lines} == exceptions.EXIT_CODES
