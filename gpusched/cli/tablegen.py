"""Writes gpusched/cli/optiontables.py: the option tables of ``gpusched.cli.quickparse``,
derived from the typer commands' own declarations.

    python -m gpusched.cli.tablegen

Run it after changing a user command's options; tests/cli/test_quickparse.py fails
until the tables match the declarations again.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import Any

from gpusched.cli.quickparse import Table

# The commands with a typer-free path for their common command lines (see console.py).
COMMANDS = {"GQUEUE": "gqueue", "GSUBMIT": "gsubmit"}
TARGET = Path(__file__).with_name("optiontables.py")


def command_table(module_name: str) -> Table:
    """The quick parser's table of one user command, read off its typer command."""
    from typer.main import get_command

    from gpusched.cli.common import _LightCoercion, use_light_coercion

    module = import_module(f"gpusched.cli.{module_name}")
    command = get_command(module.app)
    use_light_coercion(command)
    defaults = dict(command.make_context(module.PROG, []).params)
    options: dict[str, tuple[str, str, Any]] = {}
    arguments: list[tuple[str, int]] = []
    params: list[Any] = list(command.params)  # click's Option and Argument
    for param in params:
        coercion: Any = getattr(param, "_runtime_param", None)
        light = isinstance(coercion, _LightCoercion) and not param.multiple and not param.envvar
        if param.param_type_name == "argument":
            if not light or param.nargs not in (1, -1) or coercion.element is not str:
                raise ValueError(f"{module_name}: argument {param.name} is not plain")
            arguments.append((param.name, param.nargs))
            continue
        if not light or param.nargs != 1:
            spec: list[tuple[str, tuple[str, str, Any]]] = [
                (name, (param.name, "typer", None)) for name in param.opts + param.secondary_opts]
        elif param.is_flag:
            spec = [(name, (param.name, "flag", True)) for name in param.opts]
            spec += [(name, (param.name, "flag", False)) for name in param.secondary_opts]
        elif coercion.element is int:
            spec = [(name, (param.name, "int", coercion.minimum)) for name in param.opts]
        elif coercion.element is str:
            spec = [(name, (param.name, "str", None)) for name in param.opts]
        else:
            spec = [(name, (param.name, "typer", None)) for name in param.opts]
        options.update(spec)
    interspersed = command.context_settings.get("allow_interspersed_args", True)
    return Table(options, tuple(arguments), bool(interspersed), defaults)


def module_text() -> str:
    """The text of optiontables.py for the commands as they are declared now."""
    lines = ['"""The option tables of gpusched.cli.quickparse. Written by',
             "``python -m gpusched.cli.tablegen`` from the typer declarations of the",
             'commands; do not edit by hand."""', "",
             "from gpusched.cli.quickparse import Table"]
    for constant, module_name in COMMANDS.items():
        table = command_table(module_name)
        lines += ["", f"{constant} = Table(", "    options={"]
        lines += [f"        {name!r}: {spec!r}," for name, spec in table.options.items()]
        lines += ["    },", f"    arguments={table.arguments!r},",
                  f"    interspersed={table.interspersed!r},", "    defaults={"]
        lines += [f"        {name!r}: {value!r}," for name, value in table.defaults.items()]
        lines += ["    },", ")"]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Rewrite optiontables.py."""
    TARGET.write_text(module_text())
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
