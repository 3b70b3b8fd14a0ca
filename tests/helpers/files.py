"""Snapshots of a folder's files, to show that a test left it unchanged."""

from pathlib import Path


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``folder``: relative path → (size, mtime in ns)."""
    if not folder.is_dir():
        return {}
    return {
        str(path.relative_to(folder)): (path.lstat().st_size, path.lstat().st_mtime_ns)
        for path in sorted(folder.rglob("*"))
    }


def snapshot_changes(before: dict, after: dict) -> list[str]:
    """What changed between two :func:`snapshot` results, one line per path."""
    return [
        f"{'added' if name not in before else 'removed' if name not in after else 'changed'}: "
        f"{name}"
        for name in sorted(set(before) | set(after))
        if before.get(name) != after.get(name)
    ]
