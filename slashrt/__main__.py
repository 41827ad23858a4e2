import sys

from slashrt.cli import main

sys.exit(main())
