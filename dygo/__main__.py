import sys

from dygo.cli import main

sys.exit(main())
