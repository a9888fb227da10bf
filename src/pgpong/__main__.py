import sys

from pgpong.cli import main

sys.exit(main())
