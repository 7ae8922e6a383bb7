from cpkv.cli import main

raise SystemExit(main())
