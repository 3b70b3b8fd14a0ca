"""``python -m pl_privfed.cli``: the ``pl-privfed`` command."""

from __future__ import annotations

from pl_privfed.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    main()
