import sys

from benchmarks.bucketing.run import main

sys.exit(main())
