"""python3 -m workbench.bench.losses: see run.py."""

from workbench.bench.losses.run import main

raise SystemExit(main())
