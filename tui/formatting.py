"""How figures are written on screen: sizes, counts, rates, ages, paths. Missing values read
"–"."""

from pathlib import Path

MISSING = "–"
BAR_BLOCKS = " ▏▎▍▌▋▊▉█"


def size(num_bytes: int | float | None) -> str:
    if num_bytes is None:
        return MISSING
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return MISSING  # unreachable


def count(value: int | None) -> str:
    """5475584 -> 5.5M, 70553706496 -> 70.6B."""
    if value is None:
        return MISSING
    for limit, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if value >= limit:
            return f"{value / limit:.1f}{suffix}"
    return str(value)


def percent(fraction: float | None) -> str:
    return MISSING if fraction is None else f"{fraction * 100:.0f}%"


def number(value: float | None, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return MISSING
    return f"{value:.{digits}f}{unit}"


def age(seconds: float) -> str:
    if seconds < 1.5:
        return "just now"
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    return f"{seconds / 60:.0f} min ago"


def bar(fraction: float | None, width: int) -> str:
    """A horizontal bar `width` cells wide, in eighths of a cell."""
    if fraction is None:
        return " " * width
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, rest = divmod(eighths, 8)
    text = "█" * full + (BAR_BLOCKS[rest] if rest else "")
    return text.ljust(width)


def path(value: Path) -> str:
    """Relative to the current directory when under it, else with ~ for the home directory."""
    cwd, home = Path.cwd(), Path.home()
    if value.is_relative_to(cwd):
        return str(value.relative_to(cwd))
    if value.is_relative_to(home):
        return f"~/{value.relative_to(home)}"
    return str(value)
