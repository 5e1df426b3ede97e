import sys

from workbench.bench.byo_models.run import main

sys.exit(main())
