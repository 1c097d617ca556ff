import sys

from pdlab.cli import main

sys.exit(main())
