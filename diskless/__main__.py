"""``python -m diskless`` is the ``diskless`` command."""

import sys

from diskless.cli import main

sys.exit(main())
