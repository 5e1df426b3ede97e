from benchmarks.throughput.run import main

raise SystemExit(main())
