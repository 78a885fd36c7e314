"""The ``Rule`` type: one kind of diagnostic, with its id, texts and default level."""

from __future__ import annotations

import dataclasses
import string
from typing import Any

from diagnostics.levels import Level


@dataclasses.dataclass(frozen=True)
class Rule:
    """A kind of diagnostic the exporter can report.

    ``message_template`` uses ``str.format`` named fields; ``help_text`` tells the user
    what they can do about it.
    """

    id: str
    name: str
    short_description: str
    full_description: str
    message_template: str
    help_text: str
    default_level: Level
    # Part of every report, whatever the verbosity (the dispatch decisions: the former
    # exporter's contract); other rules' level-none records need verbosity DEBUG.
    recorded_at_every_verbosity: bool = False

    def format_message(self, **kwargs: Any) -> str:
        """Fill the message template with ``kwargs``.

        Raises ValueError naming the missing fields, so a wrong call is easy to fix.
        """
        try:
            return self.message_template.format(**kwargs)
        except (KeyError, IndexError):
            missing = sorted(set(self.template_fields()) - set(kwargs))
            raise ValueError(
                f"Rule {self.id} ({self.name}) message template "
                f"{self.message_template!r} needs the arguments {missing}; "
                f"got {sorted(kwargs)}."
            ) from None

    def template_fields(self) -> tuple[str, ...]:
        """The names of the fields used by ``message_template``, in order of use."""
        fields = (
            field for _, field, _, _ in string.Formatter().parse(self.message_template)
        )
        # "{a.b}" or "{a[0]}" need argument "a".
        names = (f.split(".")[0].split("[")[0] for f in fields if f)
        return tuple(dict.fromkeys(names))
