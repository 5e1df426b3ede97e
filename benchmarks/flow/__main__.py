from benchmarks.flow.run import main

raise SystemExit(main())
