"""`python -m kern_peer`: see kern_peer.cli."""

import sys

from kern_peer.cli import main

sys.exit(main())
