import sys

from benchmarks.corpus.run import main

sys.exit(main())
