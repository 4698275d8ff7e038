"""Config errors: each names the file, the line and the field, and says what would be valid.

cluster.toml:14: deployment.drafter.node: unknown node "gpu-b"; nodes are: spark, rtx5090
"""

from dataclasses import dataclass

Loc = tuple[str | int, ...]  # a path into the TOML document: ("nodes", 1, "specd")


def field_name(loc: Loc) -> str:
    """`("nodes", 1, "specd")` -> `nodes[1].specd` (indexes count [[nodes]] tables from 0)."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    file: str  # the config file as the user named it
    line: int | None  # 1-based; None when the field is absent and so is its table
    loc: Loc  # empty for errors of the whole file (TOML syntax)
    message: str
    # not a mistake found in the file: the nodes that could check it did not answer
    unreachable: bool = False

    @property
    def field(self) -> str:
        return field_name(self.loc)

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.field}: {self.message}" if self.loc else f"{where}: {self.message}"


class ConfigError(Exception):
    """The cluster file cannot be used. `issues` holds one entry per problem found; str() is
    one line per issue."""

    def __init__(self, issues: list[ConfigIssue]) -> None:
        if not issues:
            raise ValueError("ConfigError needs at least one issue")
        self.issues = issues
        super().__init__("\n".join(str(issue) for issue in issues))

    @property
    def unreachable(self) -> bool:
        """Every issue is a node that did not answer: the file may be right (plan exits 3)."""
        return all(issue.unreachable for issue in self.issues)
