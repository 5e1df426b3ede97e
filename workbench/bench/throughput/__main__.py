from workbench.bench.throughput.run import main

raise SystemExit(main())
