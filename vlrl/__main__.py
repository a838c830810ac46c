import sys

from vlrl.cli import main

sys.exit(main())
