"""``python -m fastbreaker``: the headline benchmark report (see ``fastbreaker._report``)."""

import sys

from ._report import main

if __name__ == "__main__":
    sys.exit(main())
