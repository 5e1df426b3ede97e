import sys

from workbench.bench.bucketing.run import main

sys.exit(main())
