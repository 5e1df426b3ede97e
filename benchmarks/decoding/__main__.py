import sys

from benchmarks.decoding.run import main

sys.exit(main())
