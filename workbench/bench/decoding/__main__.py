import sys

from workbench.bench.decoding.run import main

sys.exit(main())
