import sys

from benchmarks.manifest_reading.run import main

sys.exit(main())
