from titoflow.cli import main

raise SystemExit(main())
