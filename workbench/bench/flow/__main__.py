from workbench.bench.flow.run import main

raise SystemExit(main())
