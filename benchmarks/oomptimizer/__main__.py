import sys

from benchmarks.oomptimizer.run import main

sys.exit(main())
