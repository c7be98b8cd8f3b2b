"""What the command line says before Hydra reads it: Hydra's config-location flags, wherever they stand
(a subcommand's own parser does not know them), and the keys of the sections whose keys are the user's."""

from __future__ import annotations

from trainrun.errors import ConfigError

LOCATION_FLAGS = {"--config-dir": "-cd", "--config-path": "-cp", "--config-name": "-cn"}  # long: short


def split_location_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra's config-location flags with their values, the rest) of ``argv``: ``-cd DIR``,
    ``--config-dir=DIR`` and their kind, wherever they stand, for a subcommand whose own parser does
    not know them."""
    flags, rest, index = [], [], 0
    while index < len(argv):
        token = argv[index]
        name = token.split("=", 1)[0]
        if name in LOCATION_FLAGS or name in LOCATION_FLAGS.values():
            if "=" in token:
                flags += token.split("=", 1)
            elif index + 1 < len(argv):
                flags += [token, argv[index + 1]]
                index += 1
            else:
                raise ConfigError(f"flag '{token}' needs a value")
        else:
            rest.append(token)
        index += 1
    return flags, rest


# sections whose keys are the user's to name (a brought model's builder arguments): an override of a key
# there adds it where the composed config lacks it (Hydra's ``++``), as one of the schema's keys is set
OPEN_SECTIONS = ("model.kwargs.", "model.config.")


def opened(overrides: list[str]) -> list[str]:
    """``overrides`` with a plain ``key=value`` under an :data:`OPEN_SECTIONS` section made ``++key=value``."""
    return [f"++{o}" if o.startswith(OPEN_SECTIONS) and "=" in o else o for o in overrides]
