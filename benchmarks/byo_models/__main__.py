import sys

from benchmarks.byo_models.run import main

sys.exit(main())
