import sys

from structspec.cli import main

sys.exit(main())
