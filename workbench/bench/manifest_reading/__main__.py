import sys

from workbench.bench.manifest_reading.run import main

sys.exit(main())
