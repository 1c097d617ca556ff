"""``python -m pdlab.cli``: the ``pdlab`` command."""

import sys

from pdlab.cli import main

__all__: list[str] = []

sys.exit(main())
