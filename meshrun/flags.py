"""The command lines of the commands that take flags rather than Hydra overrides (`meshrun generate`,
`meshrun preset`): `--flag VALUE` or `--flag=VALUE` for a flag that takes a value (every value kept,
in order, when one is given more than once), a switch alone, `--help`, and the other arguments.
Every problem is a one-line ConfigError naming the flag, worded as train's and plan's are (meshrun.cli)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from meshrun.errors import ConfigError
from meshrun.wording import not_a_flag

HELP_FLAGS = ("-h", "--help")


@dataclass(frozen=True)
class CommandLine:
    """A command line read: the values of each value flag given, the switches given, and the
    other arguments, in order."""

    values: dict[str, list[str]]
    switches: frozenset[str]
    positional: tuple[str, ...]
    ordered: tuple[tuple[str, str], ...] = ()  # every (value flag, value), in the order given

    def only_positional(self, key: str, wanted: str) -> str:
        """The one positional argument; a ConfigError on `key` for none or several, saying
        `wanted` (what to give, e.g. "the one run dir of ...")."""
        if len(self.positional) != 1:
            got = (
                f"got {len(self.positional)} ({', '.join(map(repr, self.positional))})"
                if self.positional
                else "is required"
            )
            raise ConfigError(key, f"{got}; give {wanted}")
        return self.positional[0]


def read_command_line(
    args: list[str], command: str, value_flags: Mapping[str, str], switches: tuple[str, ...]
) -> CommandLine | None:
    """The command line `args` of `meshrun COMMAND`, whose value flags are `value_flags` (each with
    the name of its value in messages: {"--prompt": "TEXT"}) and whose switches are `switches`;
    None when it asks for --help. An unknown flag, or a value flag without its value (nothing, or
    another flag, after it), is a ConfigError."""
    rest, positional, values, given, ordered = list(args), [], {}, set(), []
    flags = (*value_flags, *switches, *HELP_FLAGS)
    while rest:
        arg = rest.pop(0)
        flag = arg.partition("=")[0]
        if arg in HELP_FLAGS:
            return None
        if flag in value_flags:
            if "=" not in arg and (not rest or rest[0].partition("=")[0] in flags):
                raise ConfigError(flag, f"got nothing; give {value_flags[flag]} after it")
            values.setdefault(flag, []).append(arg.partition("=")[2] if "=" in arg else rest.pop(0))
            ordered.append((flag, values[flag][-1]))
        elif arg in switches:
            given.add(arg)
        elif arg.startswith("-"):
            valid = [*(f"{name} {value}" for name, value in value_flags.items()), *switches, HELP_FLAGS[1]]
            raise ConfigError(flag, not_a_flag(flag, command, valid))
        else:
            positional.append(arg)
    return CommandLine(
        values=values, switches=frozenset(given), positional=tuple(positional), ordered=tuple(ordered)
    )
