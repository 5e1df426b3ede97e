"""python3 -m benchmarks.losses: see run.py."""

from benchmarks.losses.run import main

raise SystemExit(main())
