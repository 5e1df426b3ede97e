import sys

from benchmarks.allocator.run import main

sys.exit(main())
