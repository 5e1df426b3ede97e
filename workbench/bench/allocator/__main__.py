import sys

from workbench.bench.allocator.run import main

sys.exit(main())
