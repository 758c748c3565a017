"""``python -m replaygpu``: the `replaygpu` command line."""

import sys

from replaygpu.cli import main

sys.exit(main())
