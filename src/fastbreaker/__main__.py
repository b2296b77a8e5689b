"""``python -m fastbreaker``: the headline benchmark report (see ``fastbreaker.bench``)."""

import sys

from .bench import main

if __name__ == "__main__":
    sys.exit(main())
