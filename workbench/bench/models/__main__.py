import sys

from workbench.bench.models.run import main

sys.exit(main())
