from trainrun.cli import main

raise SystemExit(main())
