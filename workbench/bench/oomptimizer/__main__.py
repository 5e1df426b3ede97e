import sys

from workbench.bench.oomptimizer.run import main

sys.exit(main())
